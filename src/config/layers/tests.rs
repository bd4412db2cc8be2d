use std::collections::BTreeSet;

use super::*;
use crate::config::show::render;
use crate::error_chain::chain;
use crate::saver::unknown::UnknownSaverPolicy;

fn env(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
    vars.iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
}

fn temp_file(tag: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("rg-layers-{}-{tag}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_key_has_a_variable_of_its_own() {
    let keys = keys().unwrap();
    assert!(keys.len() > 40, "{}", keys.len());
    let vars: BTreeSet<String> = keys.iter().map(|(k, _)| env_var(k)).collect();
    assert_eq!(vars.len(), keys.len(), "two keys share a variable");
    assert!(!vars.contains(CONFIG_FILE_VAR));
    for (var, key) in [
        ("RESUMEGUARD_LISTEN", "listen"),
        ("RESUMEGUARD_ADMIN_LISTEN", "admin_listen"),
        ("RESUMEGUARD_CLAIMS_LAPSE_MS", "claims.lapse_ms"),
        ("RESUMEGUARD_UPSTREAM_TLS_SSLMODE", "upstream_tls.sslmode"),
        ("RESUMEGUARD_ADMIN_TOKEN_FILE", "admin.token_file"),
        ("RESUMEGUARD_MANAGED_ENABLED", "managed.enabled"),
    ] {
        assert!(keys.iter().any(|(k, _)| k == key), "{key}");
        assert_eq!(env_var(key), var);
    }
    // A variable ending in _FILE that is also a key's names the file of
    // the key before it (admin.token_file: admin.token's).
    for (key, _) in &keys {
        let var = env_var(key);
        if let Some(stem) = var.strip_suffix(FILE_SUFFIX).filter(|s| vars.contains(*s)) {
            assert!(key.ends_with("_file"), "{var} is {key} and {stem}'s file");
        }
    }
}

#[test]
fn flag_over_environment_over_file_over_default() {
    let file = temp_file(
        "precedence.toml",
        "listen = '127.0.0.1:7000'\nupstream = 'db:5432'\n[claims]\nlapse_ms = 100\npoll_ms = 7\n",
    );
    let vars = env(&[
        ("RESUMEGUARD_UPSTREAM", "envdb:5432"),
        ("RESUMEGUARD_CLAIMS_LAPSE_MS", "250"),
        ("RESUMEGUARD_LISTEN", "127.0.0.1:7001"),
        ("PATH", "/bin"),
    ]);
    let mut flags = Flags::default();
    flags.set("listen", "127.0.0.1:7002", "--listen");
    let l = Config::layered(Some(&file), vars, &flags).unwrap();
    std::fs::remove_file(&file).ok();
    let c = &l.config;
    assert_eq!(c.listen, "127.0.0.1:7002");
    assert_eq!(l.source("listen"), &Source::Flag("--listen".into()));
    assert_eq!(c.upstream.as_deref(), Some("envdb:5432"));
    assert_eq!(
        l.source("upstream"),
        &Source::Env("RESUMEGUARD_UPSTREAM".into())
    );
    assert_eq!(c.claims.lapse_ms, 250);
    assert_eq!(c.claims.poll_ms, 7);
    assert_eq!(l.source("claims.poll_ms"), &Source::File(file.clone()));
    assert_eq!(c.claims.holder_gone_grace_ms, 1_000);
    assert_eq!(l.source("claims.holder_gone_grace_ms"), &Source::Default);
    assert!(l.unknown_env.is_empty(), "{:?}", l.unknown_env);
}

#[test]
fn values_take_the_type_of_their_key() {
    let l = Config::layered(
        None,
        env(&[
            ("RESUMEGUARD_CLAIMS_PROXY_ID", "7"),
            ("RESUMEGUARD_CLAIMS_MAX_WAIT_MS", "900"),
            ("RESUMEGUARD_ENFORCE_VALIDITY", "false"),
            ("RESUMEGUARD_ENFORCE_UNKNOWN_SAVER", "refuse"),
            (
                "RESUMEGUARD_CLAIMS_INSPECTION_APPLICATION_NAMES",
                r#"["^ui$", "^ops"]"#,
            ),
            ("RESUMEGUARD_UPSTREAM_TLS_SNI", "false"),
            ("RESUMEGUARD_STATE_DIR", "/var/lib/rg"),
        ]),
        &Flags::default(),
    )
    .unwrap();
    let c = &l.config;
    assert_eq!(c.claims.proxy_id.as_deref(), Some("7"), "text stays text");
    assert_eq!(c.claims.max_wait_ms, Some(900));
    assert!(!c.enforce.validity);
    assert_eq!(c.enforce.unknown_saver, UnknownSaverPolicy::Refuse);
    assert_eq!(c.claims.inspection_application_names, ["^ui$", "^ops"]);
    assert_eq!(c.upstream_tls.sni, Some(false));
    assert_eq!(c.state_dir, PathBuf::from("/var/lib/rg"));
}

#[test]
fn a_wrong_value_in_the_environment_names_its_variable() {
    for (var, value, says) in [
        ("RESUMEGUARD_CLAIMS_LAPSE_MS", "soon", "soon"),
        ("RESUMEGUARD_MAX_CLIENT_CONN", "-1", "-1"),
        ("RESUMEGUARD_ENFORCE_UNKNOWN_SAVER", "ignore", "ignore"),
        ("RESUMEGUARD_TLS_REQUIRE", "yes", "yes"),
    ] {
        let err = Config::layered(None, env(&[(var, value)]), &Flags::default()).unwrap_err();
        let shown = chain(&err).to_string();
        assert!(
            shown.starts_with(&format!("environment variable {var}={value:?}: ")),
            "{shown}"
        );
        assert!(shown.contains(says), "{shown}");
    }
}

#[test]
fn unknown_variables_are_reported_not_taken() {
    let l = Config::layered(
        None,
        env(&[
            ("RESUMEGUARD_CLAIMS_LAPSE", "10"),
            ("RESUMEGUARD_CONFIG", "/etc/rg.toml"),
        ]),
        &Flags::default(),
    )
    .unwrap();
    assert_eq!(l.unknown_env, ["RESUMEGUARD_CLAIMS_LAPSE"]);
    assert_eq!(l.config.claims.lapse_ms, 2_000);
}

#[test]
fn secrets_come_from_files() {
    let token = temp_file("token", "from-a-file\n");
    let dsn = temp_file("dsn", "postgres://rg:pw@db/app\n");
    let vars = env(&[
        ("RESUMEGUARD_ADMIN_TOKEN_FILE", token.to_str().unwrap()),
        ("RESUMEGUARD_CLAIMS_DSN_FILE", dsn.to_str().unwrap()),
    ]);
    let l = Config::layered(None, vars, &Flags::default()).unwrap();
    assert_eq!(l.config.admin.token.as_deref(), Some("from-a-file"));
    assert_eq!(
        l.config.claims.dsn.as_deref(),
        Some("postgres://rg:pw@db/app")
    );
    assert_eq!(
        l.source("claims.dsn"),
        &Source::Env("RESUMEGUARD_CLAIMS_DSN_FILE".into())
    );
    let shown = render(&l).unwrap();
    assert!(
        !shown.contains("from-a-file") && !shown.contains(":pw@"),
        "{shown}"
    );

    // In the file: token_file read the same way; a token set above it wins.
    let file = temp_file(
        "token.toml",
        &format!("[admin]\ntoken_file = '{}'\n", token.display()),
    );
    let l = Config::layered(Some(&file), env(&[]), &Flags::default()).unwrap();
    assert_eq!(l.config.admin.token.as_deref(), Some("from-a-file"));
    let l = Config::layered(
        Some(&file),
        env(&[("RESUMEGUARD_ADMIN_TOKEN", "from-env")]),
        &Flags::default(),
    )
    .unwrap();
    assert_eq!(l.config.admin.token.as_deref(), Some("from-env"));

    let both = env(&[
        ("RESUMEGUARD_CLAIMS_DSN", "x"),
        ("RESUMEGUARD_CLAIMS_DSN_FILE", dsn.to_str().unwrap()),
    ]);
    let err = Config::layered(None, both, &Flags::default()).unwrap_err();
    assert!(err.to_string().contains("RESUMEGUARD_CLAIMS_DSN"), "{err}");
    let missing = env(&[("RESUMEGUARD_ADMIN_TOKEN_FILE", "/no/such/token")]);
    let err = Config::layered(None, missing, &Flags::default()).unwrap_err();
    assert!(chain(&err).to_string().contains("/no/such/token"), "{err}");
    for f in [token, dsn, file] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn a_file_error_still_names_the_file_and_line() {
    let file = temp_file("bad.toml", "listen = 'x'\n[claims]\nlapse_ms = 'soon'\n");
    let err = Config::layered(Some(&file), env(&[]), &Flags::default()).unwrap_err();
    std::fs::remove_file(&file).ok();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    assert!(
        chain(&err).to_string().contains("line 3"),
        "{}",
        chain(&err)
    );
}

#[test]
fn show_is_toml_of_the_configuration_in_effect() {
    let file = temp_file(
        "show.toml",
        "[claims]\nlapse_ms = 100\n[admin]\ntoken = 's3cret'\n",
    );
    let mut flags = Flags::default();
    flags.set("claims.proxy_id", "replica-9", "--proxy-id");
    let l = Config::layered(
        Some(&file),
        env(&[("RESUMEGUARD_CLAIMS_POLL_MS", "5")]),
        &flags,
    )
    .unwrap();
    let shown = render(&l).unwrap();
    std::fs::remove_file(&file).ok();
    assert!(!shown.contains("s3cret"), "{shown}");
    let f = file.display();
    for line in [
        "listen = \"127.0.0.1:6432\"  # default",
        "# upstream is not set  # default",
        "[claims]",
        &format!("lapse_ms = 100  # file {f}"),
        "poll_ms = 5  # env RESUMEGUARD_CLAIMS_POLL_MS",
        "proxy_id = \"replica-9\"  # flag --proxy-id",
        &format!("token = \"(redacted)\"  # file {f}"),
    ] {
        assert!(shown.lines().any(|l| l == line), "no {line:?} in\n{shown}");
    }
    // It reads back as the same configuration (the secret aside).
    let back: Config = toml::from_str(&shown).unwrap();
    assert_eq!(back.claims.lapse_ms, 100);
    assert_eq!(back.claims.proxy_id.as_deref(), Some("replica-9"));
    assert_eq!(back.audit.approver_keys, l.config.audit.approver_keys);
}

#[test]
fn changed_keys_are_named() {
    let a = Config::layered(None, env(&[]), &Flags::default()).unwrap();
    let b = Config::layered(
        None,
        env(&[
            ("RESUMEGUARD_CLAIMS_LAPSE_MS", "10"),
            ("RESUMEGUARD_LISTEN", "0.0.0.0:1"),
        ]),
        &Flags::default(),
    )
    .unwrap();
    let mut changed = a.changed(&b).unwrap();
    changed.sort();
    assert_eq!(changed, ["claims.lapse_ms", "listen"]);
    assert!(a.changed(&a).unwrap().is_empty());
}

#[test]
fn kept_keys_take_the_old_value_and_source() {
    let file = temp_file("keep.toml", "listen = '127.0.0.1:7000'\n");
    let old = Config::layered(Some(&file), env(&[]), &Flags::default()).unwrap();
    std::fs::write(&file, "listen = '127.0.0.1:7001'\n[claims]\nlapse_ms = 9\n").unwrap();
    let new = Config::layered(Some(&file), env(&[]), &Flags::default()).unwrap();
    std::fs::remove_file(&file).ok();
    let kept = new.keeping(&old, &["listen".to_owned()]).unwrap();
    assert_eq!(kept.config.listen, "127.0.0.1:7000");
    assert_eq!(kept.config.claims.lapse_ms, 9);
    assert_eq!(kept.source("listen"), &Source::File(file.clone()));
    let none = Config::layered(None, env(&[]), &Flags::default()).unwrap();
    let kept = kept
        .keeping(&none, &["claims.lapse_ms".to_owned()])
        .unwrap();
    assert_eq!(kept.config.claims.lapse_ms, 2_000);
    assert_eq!(kept.source("claims.lapse_ms"), &Source::Default);
}
