//! Start-up refusals of the gateway: a lock file or an upstream configuration that cannot be used
//! stops `toolgate proxy` with exit 2 and one message on stderr that names what is wrong and why
//! (the file, the entry, the parser's own words), before anything is opened or started.

use std::process::Stdio;

use super::Bench;

#[test]
fn a_lock_or_upstream_configuration_that_cannot_be_used_stops_start_up_and_says_why() {
    let bench = Bench::new("testbed.toml");
    let write = |name: &str, text: &str| {
        let path = bench.path(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let truncated = write("truncated.lock", r#"{"version": 1}"#);
    let future = write("future.lock", r#"{"version": 2, "upstreams": {}}"#);
    let typo = write(
        "typo.toml",
        "[upstreams.x]\ncommand = \"c\"\nargz = [\"a\"]\n",
    );
    let both = write(
        "both.toml",
        "[upstreams.x]\ncommand = \"c\"\nurl = \"https://x/mcp\"\n",
    );
    let flag = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    for (flags, expected) in [
        (
            flag(&["--lock", &truncated, "--", "true"]),
            vec![
                format!("lock file {truncated} is not a lock file"),
                "missing field `upstreams`".to_owned(),
            ],
        ),
        (
            flag(&["--lock", &future, "--", "true"]),
            vec![format!(
                "lock file {future}: version 2 (this build reads version 1)"
            )],
        ),
        (
            flag(&["--config", &typo]),
            vec![
                format!("upstream configuration {typo} is not valid"),
                "unknown field `argz`".to_owned(),
            ],
        ),
        (
            flag(&["--config", &both]),
            vec!["upstream x: give either `command`".to_owned()],
        ),
        (
            flag(&["--upstream", "a.b=true"]),
            vec!["upstream name \"a.b\"".to_owned()],
        ),
        (
            flag(&["--upstream", "a=http://example.com/mcp"]),
            vec!["upstream URL \"http://example.com/mcp\": use https://".to_owned()],
        ),
    ] {
        let out = bench
            .proxy_command(&flags, &[])
            .stdin(Stdio::null())
            .output()
            .expect("run toolgate proxy");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "stdout is the protocol: nothing on it"
        );
        for part in &expected {
            assert!(
                stderr.contains(part.as_str()),
                "{flags:?}: {part:?} in {stderr}"
            );
        }
        assert!(
            !bench.data().exists(),
            "a refused start changes nothing on disk: {flags:?}"
        );
    }
}
