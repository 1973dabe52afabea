use serde_json::{Value, json};

use super::*;

fn order_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000},
            "quantity": {"type": "integer", "exclusiveMinimum": 0},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$", "minLength": 8, "maxLength": 8},
            "currency": {"enum": ["EUR", "USD", "GBP"]},
            "day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
            "kind": {"const": "order"},
            "customer": {
                "type": "object",
                "properties": {
                    "email": {"type": "string", "format": "email"},
                    "name": {"type": "string", "minLength": 1, "maxLength": 20}
                },
                "required": ["email"]
            },
            "lines": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"],
                    "additionalProperties": false
                }
            },
            "placed_at": {"type": "string", "format": "date-time"},
            "ship_on": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "callback": {"type": "string", "format": "uri"},
            "ip": {"type": "string", "format": "ipv4"},
            "contact": {"type": "string", "format": "idn-email"},
            "note": {"type": ["string", "null"]}
        },
        "required": ["amount"]
    })
}

fn closed_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "additionalProperties": false
    })
}

/// What a case expects: valid, or one violation at `path` whose message contains `fragment`.
enum Expect {
    Valid,
    Violation(&'static str, &'static str),
}
use Expect::{Valid, Violation as Bad};

#[test]
fn arguments_are_checked_with_json_schema_semantics() {
    let order = ToolSchema::compile(&order_schema()).unwrap();
    let closed = ToolSchema::compile(&closed_schema()).unwrap();
    let cases: Vec<(&str, &ToolSchema, Value, Expect)> = vec![
        // Numbers: `type` is about the mathematical value, not how JSON spells it.
        (
            "integer literal is a number",
            &order,
            json!({"amount": 49}),
            Valid,
        ),
        ("49.0 is a number", &order, json!({"amount": 49.0}), Valid),
        ("49.5 is a number", &order, json!({"amount": 49.5}), Valid),
        (
            "49 is an integer",
            &order,
            json!({"amount": 1, "quantity": 49}),
            Valid,
        ),
        (
            "49.0 is an integer",
            &order,
            json!({"amount": 1, "quantity": 49.0}),
            Valid,
        ),
        (
            "49.5 is not an integer",
            &order,
            json!({"amount": 1, "quantity": 49.5}),
            Bad("/quantity", "49.5 is not of type \"integer\""),
        ),
        (
            "a numeric string is not a number",
            &order,
            json!({"amount": "49"}),
            Bad("/amount", "\"49\" is not of type \"number\""),
        ),
        (
            "a boolean is not a number",
            &order,
            json!({"amount": true}),
            Bad("/amount", "true is not of type \"number\""),
        ),
        (
            "null is not a number",
            &order,
            json!({"amount": null}),
            Bad("/amount", "null is not of type \"number\""),
        ),
        (
            "a union type admits null",
            &order,
            json!({"amount": 1, "note": null}),
            Valid,
        ),
        (
            "a union type names every member",
            &order,
            json!({"amount": 1, "note": 5}),
            Bad("/note", "5 is not of type \"null\" or \"string\""),
        ),
        // Bounds.
        ("minimum is inclusive", &order, json!({"amount": 0}), Valid),
        (
            "below minimum",
            &order,
            json!({"amount": -0.5}),
            Bad("/amount", "-0.5 is less than the minimum of 0"),
        ),
        (
            "above maximum",
            &order,
            json!({"amount": 1000.01}),
            Bad("/amount", "1000.01 is greater than the maximum of 1000"),
        ),
        (
            "exclusiveMinimum excludes the bound",
            &order,
            json!({"amount": 1, "quantity": 0}),
            Bad(
                "/quantity",
                "0 is not greater than the exclusive minimum of 0",
            ),
        ),
        // Strings.
        (
            "pattern and lengths pass",
            &order,
            json!({"amount": 1, "code": "ABC-1234"}),
            Valid,
        ),
        (
            "pattern",
            &order,
            json!({"amount": 1, "code": "abc-1234"}),
            Bad(
                "/code",
                "\"abc-1234\" does not match the pattern \"^[A-Z]{3}-\\d{4}$\"",
            ),
        ),
        (
            "minLength",
            &order,
            json!({"amount": 1, "customer": {"email": "a@b.co", "name": ""}}),
            Bad(
                "/customer/name",
                "\"\" has 0 characters, fewer than the minimum of 1",
            ),
        ),
        (
            "maxLength counts characters, not bytes",
            &order,
            json!({"amount": 1, "customer": {"email": "a@b.co", "name": "é".repeat(20)}}),
            Valid,
        ),
        (
            "maxLength",
            &order,
            json!({"amount": 1, "customer": {"email": "a@b.co", "name": "é".repeat(21)}}),
            Bad(
                "/customer/name",
                "has 21 characters, more than the maximum of 20",
            ),
        ),
        (
            "enum",
            &order,
            json!({"amount": 1, "currency": "JPY"}),
            Bad(
                "/currency",
                "\"JPY\" is not one of \"EUR\", \"USD\" or \"GBP\"",
            ),
        ),
        (
            "enum is exact",
            &order,
            json!({"amount": 1, "currency": "USD"}),
            Valid,
        ),
        (
            "const",
            &order,
            json!({"amount": 1, "kind": "refund"}),
            Bad("/kind", "\"refund\" is not the required value \"order\""),
        ),
        // Required, nested objects, arrays of objects.
        (
            "required at the root",
            &order,
            json!({}),
            Bad("", "missing required property \"amount\""),
        ),
        (
            "required in a nested object",
            &order,
            json!({"amount": 1, "customer": {"name": "Ada"}}),
            Bad("/customer", "missing required property \"email\""),
        ),
        (
            "type inside an array of objects",
            &order,
            json!({"amount": 1, "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "2"}]}),
            Bad("/lines/1/qty", "\"2\" is not of type \"integer\""),
        ),
        (
            "closed items refuse unknown fields",
            &order,
            json!({"amount": 1, "lines": [{"sku": "a", "qty": 1, "discount": 5}]}),
            Bad(
                "/lines/0",
                "additional property \"discount\" is not allowed",
            ),
        ),
        (
            "maxItems",
            &order,
            json!({"amount": 1, "lines": [{"sku": "a", "qty": 1}, {"sku": "a", "qty": 1}, {"sku": "a", "qty": 1}, {"sku": "a", "qty": 1}]}),
            Bad("/lines", "has 4 items, more than the maximum of 3"),
        ),
        // Formats are assertions.
        (
            "good formats pass",
            &order,
            json!({
                "amount": 1,
                "customer": {"email": "ada@example.com"},
                "placed_at": "2024-02-29T12:30:00Z",
                "ship_on": "2024-02-29",
                "id": "67e55044-10b1-426f-9247-bb680e5fe0c8",
                "callback": "https://example.com/hook?x=1",
                "ip": "192.168.0.1",
                "contact": "\u{03B1}@\u{03C0}\u{03B1}\u{03C1}.gr"
            }),
            Valid,
        ),
        (
            "bad email",
            &order,
            json!({"amount": 1, "customer": {"email": "not-an-email"}}),
            Bad(
                "/customer/email",
                "\"not-an-email\" is not a valid \"email\"",
            ),
        ),
        (
            "bad date-time",
            &order,
            json!({"amount": 1, "placed_at": "2024-02-29 12:30"}),
            Bad(
                "/placed_at",
                "\"2024-02-29 12:30\" is not a valid \"date-time\"",
            ),
        ),
        (
            "impossible date",
            &order,
            json!({"amount": 1, "ship_on": "2023-02-29"}),
            Bad("/ship_on", "is not a valid \"date\""),
        ),
        (
            "bad uuid",
            &order,
            json!({"amount": 1, "id": "67e55044-10b1-426f-9247"}),
            Bad("/id", "is not a valid \"uuid\""),
        ),
        (
            "bad uri",
            &order,
            json!({"amount": 1, "callback": "not a uri"}),
            Bad("/callback", "is not a valid \"uri\""),
        ),
        (
            "bad ipv4",
            &order,
            json!({"amount": 1, "ip": "256.1.1.1"}),
            Bad("/ip", "\"256.1.1.1\" is not a valid \"ipv4\""),
        ),
        (
            "bad idn-email (needs jsonschema's idna feature)",
            &order,
            json!({"amount": 1, "contact": "a@-.gr"}),
            Bad("/contact", "is not a valid \"idn-email\""),
        ),
        // Unknown fields: refused only where the schema says so.
        (
            "open schema accepts unknown fields",
            &order,
            json!({"amount": 1, "extra": true}),
            Valid,
        ),
        (
            "closed schema accepts its own fields",
            &closed,
            json!({"path": "/tmp"}),
            Valid,
        ),
        (
            "closed schema refuses unknown fields",
            &closed,
            json!({"path": "/tmp", "mode": 1}),
            Bad("", "additional property \"mode\" is not allowed"),
        ),
        (
            "closed schema names every unknown field",
            &closed,
            json!({"a": 1, "b": 2, "c": 3}),
            Bad(
                "",
                "additional properties \"a\", \"b\" and \"c\" are not allowed",
            ),
        ),
        (
            "long lists of names are summarised",
            &closed,
            json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7}),
            Bad(
                "",
                "additional properties \"a\", \"b\", \"c\", \"d\", \"e\" and 2 others are not allowed",
            ),
        ),
        (
            "long enums are summarised",
            &order,
            json!({"amount": 1, "day": "holiday"}),
            Bad(
                "/day",
                "\"holiday\" is not one of \"mon\", \"tue\", \"wed\", \"thu\", \"fri\" or 2 others",
            ),
        ),
        (
            "arguments must be an object",
            &closed,
            json!(["path"]),
            Bad("", "[\"path\"] is not of type \"object\""),
        ),
    ];
    for (name, schema, arguments, expect) in cases {
        let result = schema.validate(&arguments);
        match expect {
            Valid => assert_eq!(result, Ok(()), "{name}"),
            Bad(path, fragment) => {
                let invalid = result.expect_err(name);
                assert_eq!(invalid.total(), 1, "{name}: {invalid}");
                let violation = &invalid.violations()[0];
                assert_eq!(violation.path, path, "{name}");
                assert!(
                    violation.message.contains(fragment),
                    "{name}: {:?} does not contain {fragment:?}",
                    violation.message
                );
            }
        }
    }
}

#[test]
fn display_is_one_line_per_violation_with_its_path() {
    let order = ToolSchema::compile(&order_schema()).unwrap();
    let invalid = order
        .validate(&json!({"amount": "49", "customer": {"email": "not-an-email"}}))
        .unwrap_err();
    assert_eq!(
        invalid.to_string(),
        "/amount: \"49\" is not of type \"number\"\n\
         /customer/email: \"not-an-email\" is not a valid \"email\""
    );
    assert_eq!(invalid.violations()[0].keyword, "type");
    assert_eq!(invalid.violations()[1].keyword, "format");
    let root = order.validate(&json!({})).unwrap_err();
    assert_eq!(
        root.to_string(),
        "(root): missing required property \"amount\""
    );
}

#[test]
fn display_shows_five_violations_and_counts_the_rest() {
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "properties": {
            "a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"},
            "d": {"type": "string"}, "e": {"type": "string"}, "f": {"type": "string"},
            "g": {"type": "string"}, "h": {"type": "string"}
        }
    }))
    .unwrap();
    let invalid = schema
        .validate(&json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8}))
        .unwrap_err();
    assert_eq!(invalid.total(), 8);
    assert_eq!(invalid.violations().len(), 8);
    assert_eq!(
        invalid.to_string(),
        "/a: 1 is not of type \"string\"\n\
         /b: 2 is not of type \"string\"\n\
         /c: 3 is not of type \"string\"\n\
         /d: 4 is not of type \"string\"\n\
         /e: 5 is not of type \"string\"\n\
         and 3 more"
    );
}

#[test]
fn a_flood_of_violations_is_counted_not_kept() {
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}
    }))
    .unwrap();
    let ids: Vec<Value> = (0..10_000).map(|i| json!(format!("id-{i}"))).collect();
    let invalid = schema.validate(&json!({ "ids": ids })).unwrap_err();
    assert_eq!(invalid.total(), 10_000);
    assert_eq!(invalid.violations().len(), MAX_KEPT_VIOLATIONS);
    let text = invalid.to_string();
    assert_eq!(text.lines().count(), SHOWN_VIOLATIONS + 1);
    assert!(text.ends_with("and 9995 more"), "{text}");
}

#[test]
fn huge_values_are_clipped_in_messages() {
    let order = ToolSchema::compile(&order_schema()).unwrap();
    let secretish = "x".repeat(100_000);
    let invalid = order
        .validate(&json!({"amount": secretish, "lines": [{"sku": "é".repeat(5_000), "qty": 0}]}))
        .unwrap_err();
    assert_eq!(invalid.total(), 2);
    for violation in invalid.violations() {
        assert!(
            violation.message.chars().count() < 2 * MAX_QUOTED_CHARS,
            "{violation:?}"
        );
    }
    let amount = &invalid.violations()[0];
    assert_eq!(amount.path, "/amount");
    let expected = format!(
        "\"{}… is not of type \"number\"",
        "x".repeat(MAX_QUOTED_CHARS - 2)
    );
    assert_eq!(amount.message, expected);

    // A whole object quoted in a message is cut too, inside multi-byte characters or not.
    let closed =
        ToolSchema::compile(&json!({"type": "object", "properties": {"doc": {"type": "string"}}}))
            .unwrap();
    let doc: serde_json::Map<String, Value> = (0..1_000)
        .map(|i| (format!("clé-{i}"), json!("vàlue")))
        .collect();
    let invalid = closed.validate(&json!({ "doc": doc })).unwrap_err();
    let message = &invalid.violations()[0].message;
    assert!(message.starts_with("{\"clé-0\":\"vàlue\""), "{message}");
    assert!(message.contains("… is not of type \"string\""), "{message}");
    assert!(
        message.chars().count() <= MAX_QUOTED_CHARS + 30,
        "{message}"
    );
}

#[test]
fn long_property_names_do_not_make_long_messages() {
    let closed = ToolSchema::compile(&closed_schema()).unwrap();
    let invalid = closed
        .validate(&json!({ "k".repeat(10_000): 1 }))
        .unwrap_err();
    let message = &invalid.violations()[0].message;
    assert!(message.chars().count() < 2 * MAX_QUOTED_CHARS, "{message}");
    assert!(message.contains('…'));
}

#[test]
fn compile_refuses_a_root_that_is_not_an_object_schema() {
    let cases = [
        (json!({"type": "array", "items": {}}), "\"type\": \"array\""),
        (json!({"properties": {"a": {}}}), "no \"type\""),
        (
            json!({"type": ["object", "null"]}),
            "\"type\": [\"object\",\"null\"]",
        ),
        (json!(true), "a boolean instead of a schema object"),
        (json!("object"), "a string instead of a schema object"),
    ];
    for (schema, found_fragment) in cases {
        match ToolSchema::compile(&schema) {
            Err(SchemaError::RootNotObject { found }) => {
                assert!(found.contains(found_fragment), "{schema}: {found}");
            }
            other => panic!("{schema}: expected RootNotObject, got {other:?}"),
        }
    }
}

#[test]
fn compile_refuses_invalid_json_schema() {
    let cases = [
        (
            json!({"type": "object", "properties": {"a": {"type": "number", "minimum": "x"}}}),
            "/properties/a/minimum",
            "\"x\" is not of type \"number\"",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "text"}}}),
            "/properties/a/type",
            "\"text\"",
        ),
        (
            json!({"type": "object", "required": "a"}),
            "/required",
            "\"a\" is not of type \"array\"",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}),
            "/properties/a/pattern",
            "",
        ),
    ];
    for (schema, location_expected, fragment) in cases {
        match ToolSchema::compile(&schema) {
            Err(SchemaError::Invalid { location, message }) => {
                assert_eq!(location, location_expected, "{schema}: {message}");
                assert!(message.contains(fragment), "{schema}: {message}");
            }
            other => panic!("{schema}: expected Invalid, got {other:?}"),
        }
    }
    let error = ToolSchema::compile(&json!({"type": "object", "minimum": "x"})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "input schema is not valid JSON Schema at /minimum: \"x\" is not of type \"number\""
    );
}

#[test]
fn compile_never_fetches_an_external_reference() {
    for reference in [
        "https://example.com/schemas/order.json",
        "file:///etc/passwd",
    ] {
        let schema = json!({"type": "object", "properties": {"a": {"$ref": reference}}});
        let error = ToolSchema::compile(&schema).unwrap_err();
        assert!(matches!(error, SchemaError::Invalid { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains(&format!("toolgate does not fetch {reference}")),
            "{error}"
        );
    }
}

#[test]
fn the_dialect_is_2020_12_unless_the_schema_names_another() {
    // `prefixItems` exists only in 2020-12; absent `$schema`, it must be enforced.
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]}}
    }))
    .unwrap();
    let invalid = schema.validate(&json!({"point": [1, "2"]})).unwrap_err();
    assert_eq!(invalid.violations()[0].path, "/point/1");

    let draft7 = ToolSchema::compile(&json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date"}},
        "additionalProperties": false
    }))
    .unwrap();
    assert_eq!(draft7.validate(&json!({"when": "2024-01-31"})), Ok(()));
    assert!(draft7.validate(&json!({"when": "31/01/2024"})).is_err());
}

#[test]
fn unknown_formats_stay_annotations() {
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "properties": {"secret": {"type": "string", "format": "password"}}
    }))
    .unwrap();
    assert_eq!(schema.validate(&json!({"secret": "hunter2"})), Ok(()));
}

#[test]
fn local_references_are_followed() {
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "$defs": {"Customer": {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}}},
        "properties": {"customer": {"$ref": "#/$defs/Customer"}}
    }))
    .unwrap();
    let invalid = schema
        .validate(&json!({"customer": {"email": "nope"}}))
        .unwrap_err();
    assert_eq!(invalid.violations()[0].path, "/customer/email");
    assert_eq!(schema.property_types()["customer"], vec![JsonType::Object]);
}

#[test]
fn property_types_report_what_each_argument_may_hold() {
    use JsonType::*;
    let schema = ToolSchema::compile(&json!({
        "type": "object",
        "$defs": {
            "Amount": {"type": "number"}
        },
        "properties": {
            "path": {"type": "string"},
            "count": {"type": "integer"},
            "note": {"type": ["string", "null"]},
            "anything": {},
            "described": {"description": "no type"},
            "mode": {"enum": ["r", "w", 1]},
            "kind": {"const": true},
            "amount": {"$ref": "#/$defs/Amount"},
            "optional_amount": {"anyOf": [{"$ref": "#/$defs/Amount"}, {"type": "null"}]},
            "either": {"oneOf": [{"type": "string"}, {}]},
            "never": false
        }
    }))
    .unwrap();
    let types = schema.property_types();
    assert_eq!(types["path"], vec![String]);
    assert_eq!(types["count"], vec![Integer]);
    assert_eq!(types["note"], vec![Null, String]);
    assert_eq!(types["anything"], JsonType::ALL.to_vec());
    assert_eq!(types["described"], JsonType::ALL.to_vec());
    assert_eq!(types["mode"], vec![Integer, String]);
    assert_eq!(types["kind"], vec![Boolean]);
    assert_eq!(types["amount"], vec![Number]);
    assert_eq!(types["optional_amount"], vec![Null, Number]);
    assert_eq!(types["either"], JsonType::ALL.to_vec());
    assert_eq!(types["never"], Vec::<JsonType>::new());
    assert_eq!(types.len(), 11);
    assert!(schema.has_property("path"));
    assert!(!schema.has_property("Amount"));
    assert!(!schema.has_property("missing"));
}

#[test]
fn compile_refuses_a_dangling_local_reference() {
    let schema = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}});
    assert!(matches!(
        ToolSchema::compile(&schema),
        Err(SchemaError::Invalid { .. })
    ));
}

#[test]
fn a_reference_cycle_does_not_hang_type_extraction() {
    let root = json!({"$defs": {"Loop": {"$ref": "#/$defs/Loop"}}});
    assert_eq!(
        declared_types(&root, &json!({"$ref": "#/$defs/Loop"}), 0),
        JsonType::ALL.to_vec()
    );
}

#[test]
fn json_types_follow_json_schema_numbers() {
    assert!(JsonType::Integer.admits(&json!(49)));
    assert!(JsonType::Integer.admits(&json!(49.0)));
    assert!(!JsonType::Integer.admits(&json!(49.5)));
    assert!(JsonType::Number.admits(&json!(49)));
    assert!(JsonType::Number.admits(&json!(49.5)));
    assert!(!JsonType::Number.admits(&json!("49")));
    assert!(!JsonType::Number.admits(&json!(true)));
    assert!(JsonType::Null.admits(&Value::Null));
    assert_eq!(JsonType::of(&json!(u64::MAX)), JsonType::Integer);
    assert_eq!(JsonType::of(&json!(-3)), JsonType::Integer);
    assert_eq!(JsonType::from_name("integer"), Some(JsonType::Integer));
    assert_eq!(JsonType::from_name("int"), None);
    for t in JsonType::ALL {
        assert_eq!(JsonType::from_name(t.as_str()), Some(t));
        assert_eq!(t.to_string(), t.as_str());
    }
}

#[test]
fn a_compiled_schema_can_be_shared_across_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<ToolSchema>();
    shared::<Invalid>();
    shared::<SchemaError>();
}
