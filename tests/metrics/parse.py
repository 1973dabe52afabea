"""Reads a Prometheus text exposition on stdin with the official Python client's parser and prints
its samples as JSON: [{"name", "labels", "value", "type"}]. A line the parser refuses fails the
script (and the test that runs it)."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        samples.append(
            {"name": sample.name, "labels": sample.labels, "value": sample.value, "type": family.type}
        )
print(json.dumps(samples))
