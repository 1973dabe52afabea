//! Who is at the keyboard: the OS user this process runs as, for `local:<user>` (the stdio caller)
//! and `human:<user>` (a person deciding approvals or flipping the kill switch).

use toolgate_core::principal::Principal;

/// The OS user name: `$USER`, `$LOGNAME`, else the name of this process's uid in `/etc/passwd`,
/// else `uid-N`.
#[must_use]
pub fn os_user() -> String {
    for var in ["USER", "LOGNAME"] {
        // Who is at the keyboard is the login's business; the shell says so in these variables.
        #[allow(clippy::disallowed_methods)]
        let name = std::env::var(var);
        if let Ok(name) = name
            && !name.is_empty()
        {
            return name;
        }
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next().map(str::to_owned))
        });
    let Some(uid) = uid else {
        return "unknown".to_owned();
    };
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                (fields.nth(1)? == uid).then(|| name.to_owned())
            })
        })
        .unwrap_or_else(|| format!("uid-{uid}"))
}

/// The identity a person decides as unless they say otherwise.
#[must_use]
pub fn human() -> String {
    format!("human:{}", os_user())
}

/// Who calls on stdio: the local user this process runs as (`local:<user>`).
#[must_use]
pub fn local_principal() -> Principal {
    Principal::new(format!("local:{}", os_user()))
}
