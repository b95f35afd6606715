//! Unit tests of the relay configuration: value parsers, the overlay of
//! file and flags, validation, and the agreement of `--help`, the TOML keys
//! and the READMEs with the declared settings.

use super::*;
use clap::Parser;

fn flags(args: &[&str]) -> Settings {
    let mut v = vec!["skiff-relay"];
    v.extend_from_slice(args);
    Cli::try_parse_from(v).expect("flags parse").settings
}

// --- value parsers ---

#[test]
fn byte_sizes() {
    assert_eq!("65536".parse::<ByteSize>(), Ok(ByteSize(65536)));
    assert_eq!("64KiB".parse::<ByteSize>(), Ok(ByteSize(64 << 10)));
    assert_eq!("16 MiB".parse::<ByteSize>(), Ok(ByteSize(16 << 20)));
    assert_eq!("1g".parse::<ByteSize>(), Ok(ByteSize(1 << 30)));
    assert_eq!("2MB".parse::<ByteSize>(), Ok(ByteSize(2_000_000)));
    assert!("MiB".parse::<ByteSize>().is_err());
    assert!("12 parsecs".parse::<ByteSize>().is_err());
    assert!("99999999999999999999".parse::<ByteSize>().is_err());
    assert!("17179869184GiB".parse::<ByteSize>().is_err());
}

#[test]
fn durations() {
    assert_eq!(
        "250ms".parse::<DurationArg>(),
        Ok(DurationArg(Duration::from_millis(250)))
    );
    assert_eq!(
        "7".parse::<DurationArg>(),
        Ok(DurationArg(Duration::from_secs(7)))
    );
    assert_eq!(
        "2m".parse::<DurationArg>(),
        Ok(DurationArg(Duration::from_secs(120)))
    );
    assert!("2h".parse::<DurationArg>().is_err());
    assert!("-1s".parse::<DurationArg>().is_err());
}

#[test]
fn upstream_urls() {
    let u: Upstream = "tcp://relay.example:4443/room/a".parse().unwrap();
    assert_eq!(
        u,
        Upstream {
            host: "relay.example".into(),
            port: 4443,
            path: "room/a".into(),
            scheme: UpstreamScheme::Tcp,
        }
    );
    let u: Upstream = "tls://relay.example:4443/room".parse().unwrap();
    assert_eq!(u.scheme, UpstreamScheme::Tls);
    assert_eq!(u.to_string(), "tls://relay.example:4443/room");
    let u: Upstream = "moql://relay.example:443/anon".parse().unwrap();
    assert_eq!(
        (u.scheme, u.host.as_str(), u.port, u.path.as_str()),
        (UpstreamScheme::Quic, "relay.example", 443, "anon")
    );
    assert_eq!(u.to_string(), "moql://relay.example:443/anon");
    let u: Upstream = "tcp://[::1]:9000".parse().unwrap();
    assert_eq!(
        (u.host.as_str(), u.port, u.path.as_str()),
        ("::1", 9000, "")
    );
    assert_eq!(u.to_string(), "tcp://[::1]:9000/");
    // A token in the query stays out of what is printed.
    let u: Upstream = "tcp://h:1/room?jwt=secret".parse().unwrap();
    assert_eq!(u.path, "room?jwt=secret");
    assert_eq!(u.to_string(), "tcp://h:1/room?…");
    assert!("https://x:1/".parse::<Upstream>().is_err());
    assert!("tcp://x/".parse::<Upstream>().is_err());
    assert!("tcp://:1/".parse::<Upstream>().is_err());
    assert!("tcp://x:0/".parse::<Upstream>().is_err());
    assert!("tcp://x:70000/".parse::<Upstream>().is_err());
    assert!("tcp://[::1/".parse::<Upstream>().is_err());
}

// --- merging ---

#[test]
fn defaults_without_file_or_flags() {
    let cfg = RelayConfig::merge(&Settings::default(), &Settings::default()).unwrap();
    assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(cfg, RelayConfig::default());
}

#[test]
fn flags_override_file() {
    let file = Settings::from_toml(
        "listen = \"0.0.0.0:9000\"\nthreads = 3\nmax-connections = 7\ncache_bytes = \"1MiB\"\n\
         max-frame-bytes = 1000\nlog = \"debug\"\ndriver = \"legacy\"\ndrain-timeout = \"250ms\"\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let cfg = RelayConfig::merge(&file, &flags(&["--threads", "1", "--log", "warn"])).unwrap();
    assert_eq!(cfg.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(cfg.threads.get(), 1);
    assert_eq!(cfg.limits.max_connections, 7);
    assert_eq!(cfg.limits.max_frame_bytes, 1000);
    assert_eq!(cfg.cache_bytes, 1 << 20);
    assert_eq!(cfg.log.0, tracing::level_filters::LevelFilter::WARN);
    assert_eq!(cfg.driver, DriverKind::Legacy);
    assert_eq!(cfg.drain_timeout, Duration::from_millis(250));
}

#[test]
fn auth_settings_from_file_and_flags() {
    let dir = std::env::temp_dir().join(format!("skiff-cfg-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("k.jwk");
    std::fs::write(
        &key,
        r#"{"kty":"oct","alg":"HS256","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#,
    )
    .unwrap();
    let text = format!(
        "auth-key = {:?}\nauth-public = [\"anon/**\"]\nupstream-token-file = \"t\"\n",
        key.display().to_string()
    );
    let file = Settings::from_toml(&text, Path::new("a.toml")).unwrap();
    let cfg = RelayConfig::merge(&file, &flags(&[])).unwrap();
    assert_eq!(cfg.auth.key.as_deref(), Some(key.as_path()));
    assert!(cfg.auth.public.matches("anon/x"));
    assert_eq!(cfg.upstream_token_file.as_deref(), Some(Path::new("t")));
    let cfg = RelayConfig::merge(&file, &flags(&["--auth-public", "a/**,b/*"])).unwrap();
    assert!(cfg.auth.public.matches("b/x") && !cfg.auth.public.matches("anon/x"));
    // Refused: a literal public pattern, a bad pattern, both key forms, a bad key.
    for args in [
        &["--auth-public", "anon"][..],
        &["--auth-public", "a/**/b/**"],
        &["--auth-key-dir", "/"],
        &["--auth-key", "/nonexistent/k.jwk", "--auth-key-dir", "/"],
    ] {
        let f = if args[0] == "--auth-key" {
            Settings::default()
        } else {
            file.clone()
        };
        assert!(RelayConfig::merge(&f, &flags(args)).is_err(), "{args:?}");
    }
    std::fs::write(&key, "{}").unwrap();
    assert!(RelayConfig::merge(&file, &flags(&[])).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn file_rejects_unknown_keys_and_bad_values() {
    let p = Path::new("bad.toml");
    for text in [
        "lisen = \"127.0.0.1:1\"",
        "listen = \"not an address\"",
        "threads = \"two\"",
        "max-connections = -1",
        "cache-bytes = \"3 lightyears\"",
        "upstream = \"http://a:1/\"",
        "log = \"loud\"",
        "[section]\nx = 1",
        "threads = ",
    ] {
        let err = Settings::from_toml(text, p).unwrap_err();
        assert!(
            matches!(err, ConfigError::ParseFile { .. }),
            "{text}: {err}"
        );
    }
}

#[test]
fn inconsistent_limits_are_rejected() {
    let err = RelayConfig::merge(
        &Settings::default(),
        &flags(&["--max-frame-bytes", "2MiB", "--max-group-bytes", "1MiB"]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("max-frame-bytes"), "{err}");
    for args in [
        ["--threads", "0"],
        ["--max-connections", "0"],
        ["--threads", "5000"],
    ] {
        assert!(RelayConfig::merge(&Settings::default(), &flags(&args)).is_err());
    }
}

#[test]
fn per_address_limits_and_proxy_protocol_sources() {
    // By default: no limit on an address's open connections, a quarter of
    // --max-handshakes on its handshakes, no load balancer.
    let d = RelayConfig::default();
    assert_eq!(d.quotas.connections_per_ip, None);
    assert_eq!(d.quotas.handshakes_per_ip, 256);
    assert!(d.proxy_protocol_from.is_empty());
    let cfg =
        RelayConfig::merge(&Settings::default(), &flags(&["--max-handshakes", "40"])).unwrap();
    assert_eq!(cfg.quotas.handshakes_per_ip, 10);
    let cfg = RelayConfig::merge(&Settings::default(), &flags(&["--max-handshakes", "2"])).unwrap();
    assert_eq!(cfg.quotas.handshakes_per_ip, 1);

    let file = Settings::from_toml(
        "max-connections-per-ip = 5
max-handshakes-per-ip = 7
         proxy-protocol-from = [\"10.0.0.0/8\", \"192.0.2.7\"]\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let cfg = RelayConfig::merge(&file, &flags(&[])).unwrap();
    assert_eq!(cfg.quotas.connections_per_ip, Some(5));
    assert_eq!(cfg.quotas.handshakes_per_ip, 7);
    let lb = |ip: &str| cfg.proxy_protocol_from.contains(ip.parse().unwrap());
    assert!(lb("10.9.8.7") && lb("192.0.2.7") && !lb("192.0.2.8"));
    // Flags replace the file's list; repeated or comma-separated.
    let cfg = RelayConfig::merge(
        &file,
        &flags(&[
            "--proxy-protocol-from",
            "2001:db8::/32,198.51.100.1",
            "--proxy-protocol-from",
            "203.0.113.0/24",
        ]),
    )
    .unwrap();
    let lb = |ip: &str| cfg.proxy_protocol_from.contains(ip.parse().unwrap());
    assert!(lb("2001:db8::5") && lb("198.51.100.1") && lb("203.0.113.9") && !lb("10.9.8.7"));
    for args in [
        &["--max-connections-per-ip", "0"][..],
        &["--max-handshakes-per-ip", "0"],
        &["--proxy-protocol-from", "lb.example"],
        &["--proxy-protocol-from", "10.0.0.0/40"],
    ] {
        let err = RelayConfig::merge(&Settings::default(), &flags(args)).unwrap_err();
        assert!(err.to_string().contains(&args[0][2..]), "{args:?}: {err}");
    }
}

#[test]
fn web_dir_from_default_file_and_flag() {
    let d = RelayConfig::default();
    assert!(d.web_dir.ends_with("web/dist"), "{}", d.web_dir.display());
    let file = Settings::from_toml("web-dir = \"/srv/player\"\n", Path::new("t.toml")).unwrap();
    let cfg = RelayConfig::merge(&file, &flags(&[])).unwrap();
    assert_eq!(cfg.web_dir, Path::new("/srv/player"));
    let cfg = RelayConfig::merge(&file, &flags(&["--web-dir", "/tmp/p"])).unwrap();
    assert_eq!(cfg.web_dir, Path::new("/tmp/p"));
}

#[test]
fn quick_ack_is_on_unless_turned_off() {
    assert!(RelayConfig::default().quick_ack);
    let none = Settings::from_toml("", Path::new("t.toml")).unwrap();
    assert!(RelayConfig::merge(&none, &flags(&[])).unwrap().quick_ack);
    assert!(
        RelayConfig::merge(&none, &flags(&["--quick-ack"]))
            .unwrap()
            .quick_ack
    );
    assert!(
        !RelayConfig::merge(&none, &flags(&["--quick-ack=false"]))
            .unwrap()
            .quick_ack
    );
    let file = Settings::from_toml("quick-ack = false\n", Path::new("t.toml")).unwrap();
    assert!(!RelayConfig::merge(&file, &flags(&[])).unwrap().quick_ack);
    assert!(
        RelayConfig::merge(&file, &flags(&["--quick-ack=true"]))
            .unwrap()
            .quick_ack
    );
}

#[test]
fn timeouts_credit_and_send_buffer() {
    let d = RelayConfig::default();
    assert_eq!(d.timeouts.handshake, Duration::from_secs(10));
    assert_eq!(d.timeouts.write, Duration::from_secs(10));
    assert_eq!(d.timeouts.idle, Duration::from_secs(30));
    assert_eq!(d.stream_credit, 256 << 10);
    assert_eq!(d.connection_credit(), 1 << 20);
    assert_eq!(d.send_buffer, None);
    let file = Settings::from_toml(
        "handshake-timeout = \"2s\"\nwrite_timeout = \"500ms\"\nidle-timeout = 5\n\
         send-buffer = \"64KiB\"\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let cfg = RelayConfig::merge(&file, &flags(&["--stream-credit", "1MiB"])).unwrap();
    assert_eq!(cfg.timeouts.handshake, Duration::from_secs(2));
    assert_eq!(cfg.timeouts.write, Duration::from_millis(500));
    assert_eq!(cfg.timeouts.idle, Duration::from_secs(5));
    assert_eq!(cfg.send_buffer, Some(64 << 10));
    // The connection window follows the stream window unless given.
    assert_eq!(cfg.stream_credit, 1 << 20);
    assert_eq!(cfg.connection_credit(), 4 << 20);
    let cfg = RelayConfig::merge(
        &file,
        &flags(&["--stream-credit", "1MiB", "--connection-credit", "2MiB"]),
    )
    .unwrap();
    assert_eq!(cfg.connection_credit(), 2 << 20);
    for args in [
        vec!["--handshake-timeout", "0"],
        vec!["--write-timeout", "0ms"],
        vec!["--stream-credit", "100"],
        vec!["--stream-credit", "1MiB", "--connection-credit", "512KiB"],
        vec!["--send-buffer", "1"],
    ] {
        assert!(
            RelayConfig::merge(&Settings::default(), &flags(&args)).is_err(),
            "{args:?}"
        );
    }
}

#[test]
fn session_config_applies_the_limits() {
    let mut cfg = RelayConfig::default();
    cfg.limits.max_streams = 10;
    cfg.limits.max_subscriptions = 3;
    cfg.limits.max_frame_bytes = 1000;
    cfg.stream_credit = 1 << 20;
    cfg.connection_credit = Some(8 << 20);
    cfg.timeouts.idle = Duration::from_secs(7);
    cfg.timeouts.handshake = Duration::from_secs(2);
    let s = cfg.session_config(42);
    assert_eq!(s.hop, 42);
    assert_eq!(s.max_served, 3);
    assert_eq!(s.max_frame_bytes, 1000);
    assert_eq!(s.setup_timeout.as_micros(), 2_000_000);
    assert_eq!(s.control_timeout.as_micros(), 2_000_000);
    assert_eq!(s.conn.max_idle_timeout.as_micros(), 7_000_000);
    assert_eq!(s.conn.handshake_timeout.as_micros(), 3_000_000);
    assert_eq!(s.conn.max_data, 8 << 20);
    assert_eq!(s.conn.max_stream_data_uni, 1 << 20);
    assert_eq!(s.conn.max_stream_data_bidi_remote, 1 << 20);
    assert_eq!(s.conn.max_streams_bidi, Some(10));
    assert_eq!(s.conn.max_streams_uni, Some(10));
    // More streams than the table holds are capped at a quarter of it.
    cfg.limits.max_streams = 1000;
    let s = cfg.session_config(1);
    let quarter = (crate::storage::STREAMS / 4) as u64;
    assert_eq!(s.conn.max_streams_uni, Some(quarter));
    // A trunk (worker link, upstream) takes a quarter of its larger table
    // and any number of subscriptions its table holds.
    let trunk = cfg.trunk_session_config(1);
    let quarter = (crate::storage::TRUNK_STREAMS / 4) as u64;
    assert_eq!(trunk.conn.max_streams_bidi, Some(quarter));
    assert_eq!(trunk.conn.max_streams_uni, Some(quarter));
    assert_eq!(trunk.max_served, usize::MAX);
    assert_eq!(s.max_waiting_tracks, 16);
    assert_eq!(s.max_fetches, 4);
    cfg.quotas.fetches = 2;
    assert_eq!(cfg.session_config(1).max_fetches, 2);
    assert_eq!(trunk.max_waiting_tracks, usize::MAX);
    assert_eq!(trunk.conn.max_stream_data_uni, s.conn.max_stream_data_uni);
    let t = cfg.track_limits(5 << 20);
    assert_eq!((t.group_bytes, t.cache_bytes), (16 << 20, 5 << 20));
}

#[test]
fn bad_flags_are_parse_errors() {
    for args in [
        vec!["skiff-relay", "--listen", "nowhere"],
        vec!["skiff-relay", "--threads", "-2"],
        vec!["skiff-relay", "--cache-bytes", "lots"],
        vec!["skiff-relay", "--bogus"],
        vec!["skiff-relay", "frobnicate"],
    ] {
        assert!(Cli::try_parse_from(&args).is_err(), "{args:?}");
    }
}

#[test]
fn subcommands_and_global_flags() {
    let cli = Cli::try_parse_from(["skiff-relay", "serve", "--threads", "2"]).unwrap();
    assert!(matches!(cli.command, Some(Command::Serve)));
    assert_eq!(cli.settings.threads, Some(2));
    let cli = Cli::try_parse_from(["skiff-relay", "--listen", "127.0.0.1:0"]).unwrap();
    assert!(cli.command.is_none());
    let cli =
        Cli::try_parse_from(["skiff-relay", "demo", "--seconds", "4", "--viewers", "2"]).unwrap();
    match cli.command {
        Some(Command::Demo(d)) => {
            assert_eq!((d.seconds, d.viewers, d.fps), (4, 2, 30));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tls_files_come_in_pairs_and_must_load() {
    let file = Settings::from_toml(
        "tls-cert = \"/nonexistent/c.pem\"\ntls_key = \"/nonexistent/k.pem\"\nupstream-ca = \"/nonexistent/ca.pem\"\n",
        Path::new("t.toml"),
    )
    .unwrap();
    assert_eq!(
        file.tls_cert.as_deref(),
        Some(Path::new("/nonexistent/c.pem"))
    );
    assert_eq!(
        file.tls_key.as_deref(),
        Some(Path::new("/nonexistent/k.pem"))
    );
    let err = RelayConfig::merge(&file, &Settings::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("tls-cert") && text.contains("/nonexistent/c.pem"),
        "{text}"
    );
    let half = Settings {
        tls_cert: Some("c.pem".into()),
        ..Settings::default()
    };
    let err = RelayConfig::merge(&Settings::default(), &half).unwrap_err();
    assert!(err.to_string().contains("--tls-key"), "{err}");
    let ca = Settings {
        upstream_ca: Some("/nonexistent/ca.pem".into()),
        ..Settings::default()
    };
    let err = RelayConfig::merge(&Settings::default(), &ca).unwrap_err();
    assert!(err.to_string().contains("upstream-ca"), "{err}");
}

#[test]
fn upstream_fingerprint_is_64_hex_digits_and_not_with_a_ca() {
    let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    let cfg = RelayConfig::merge(
        &Settings::default(),
        &flags(&[
            "--upstream=moql://127.0.0.1:4443/",
            "--upstream-fingerprint",
            hex,
        ]),
    )
    .unwrap();
    let pin = cfg.upstream_fingerprint.expect("pinned");
    assert_eq!(pin.to_string(), hex.to_ascii_lowercase());
    let file = Settings::from_toml(
        &format!("upstream-fingerprint = \"{hex}\""),
        Path::new("t.toml"),
    )
    .unwrap();
    let cfg = RelayConfig::merge(&file, &Settings::default()).unwrap();
    assert_eq!(cfg.upstream_fingerprint, Some(pin));
    let mut v = vec!["skiff-relay", "--upstream-fingerprint", "abcd"];
    assert!(Cli::try_parse_from(&v).is_err(), "4 digits");
    v[2] = "zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    assert!(Cli::try_parse_from(&v).is_err(), "not hex");
    let dir = std::env::temp_dir().join(format!("skiff-upstream-pin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let both = flags(&[
        "--upstream-fingerprint",
        hex,
        "--upstream-ca",
        ca.to_str().unwrap(),
    ]);
    let err = RelayConfig::merge(&Settings::default(), &both).unwrap_err();
    assert!(err.to_string().contains("upstream-fingerprint"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_generate_names_hosts_and_excludes_certificate_files() {
    let v = RelayConfig::merge(
        &Settings::default(),
        &flags(&["--tls-generate", "localhost, 127.0.0.1,::1"]),
    )
    .unwrap();
    assert_eq!(v.tls_generate, ["localhost", "127.0.0.1", "::1"]);
    assert_eq!(
        v.tls_source(),
        Some(crate::tls::TlsSource::Generate(vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into()
        ]))
    );
    assert_eq!(RelayConfig::default().tls_source(), None);
    let file = Settings::from_toml(
        "tls-generate = [\"relay.example\", \"10.0.0.1\"]\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let v = RelayConfig::merge(&file, &Settings::default()).unwrap();
    assert_eq!(v.tls_generate, ["relay.example", "10.0.0.1"]);
    for (args, says) in [
        (&["--tls-generate", "a b"][..], "`a b` is neither"),
        (&["--tls-generate", ","][..], "at least one host"),
        (
            &["--tls-generate", "localhost", "--tls-cert", "c.pem"][..],
            "not both",
        ),
        (
            &["--tls-generate", "localhost", "--tls-key", "k.pem"][..],
            "not both",
        ),
    ] {
        let err = RelayConfig::merge(&Settings::default(), &flags(args)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tls-generate") && text.contains(says),
            "{args:?}: {text}"
        );
    }
}

// --- one declaration: --help, TOML keys and the READMEs agree with it ---

/// The field names serde's derive accepts for [`Settings`]: the TOML keys.
fn toml_keys() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor, value::Error};
    use std::cell::Cell;

    /// A deserializer that records the field list a struct asks for.
    struct FieldNames<'a>(&'a Cell<&'static [&'static str]>);

    impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
        type Error = Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(Error::custom("only a struct's field names are recorded"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            self.0.set(fields);
            Err(Error::custom("field names recorded"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    let fields = Cell::new(&[][..]);
    let _ = <Settings as serde::Deserialize>::deserialize(FieldNames(&fields));
    fields.get()
}

/// The `--flag`s of the first column of every table row in `readme` whose
/// header names a `flag` column, with the row's `default` cell.
fn readme_rows(readme: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut default_column = None;
    let mut in_flag_table = false;
    for line in readme.lines() {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        if !line.trim_start().starts_with('|') {
            in_flag_table = false;
            continue;
        }
        if cells.get(1).is_some_and(|c| c.starts_with("flag")) {
            in_flag_table = true;
            default_column = cells.iter().position(|c| *c == "default");
            continue;
        }
        let Some(first) = cells.get(1).filter(|_| in_flag_table) else {
            continue;
        };
        let Some(flag) = first.strip_prefix("`--") else {
            continue;
        };
        let name: String = flag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let default = default_column
            .and_then(|i| cells.get(i))
            .map_or(String::new(), |c| c.to_string());
        rows.push((name, default));
    }
    rows
}

#[test]
fn keys_agree_with_help_toml_and_readmes() {
    use clap::CommandFactory;
    use std::collections::BTreeSet;

    let keys: Vec<String> = Settings::keys().collect();
    let unique: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(unique.len(), keys.len(), "a key is declared twice");

    // The TOML file takes exactly the declared keys.
    assert_eq!(toml_keys(), keys.as_slice(), "TOML keys");

    // The command line takes each key as a global flag with help text, and
    // has no flag that is not a key but `--config` (and clap's own).
    let mut cmd = Cli::command();
    cmd.build();
    let help = cmd.render_long_help().to_string();
    for key in &keys {
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .unwrap_or_else(|| panic!("no flag --{key}"));
        assert!(arg.is_global_set(), "--{key} is not global");
        assert!(arg.get_help().is_some(), "--{key} has no help text");
        assert!(help.contains(&format!("--{key}")), "--help lacks --{key}");
    }
    for arg in cmd.get_arguments() {
        let long = arg.get_long().unwrap_or_default();
        assert!(
            unique.contains(long) || ["config", "help", "version"].contains(&long),
            "--{long} is no declared setting"
        );
    }

    // A default `--help` shows is the default: given as a flag or in the
    // file, it changes nothing.
    let defaults = RelayConfig::default();
    for (field, key) in Settings::FIELDS.iter().zip(&keys) {
        let Some(spelling) = Settings::default_spelling(field) else {
            continue;
        };
        assert!(
            help.contains(&format!("[default: {spelling}]")),
            "--help lacks --{key}'s default {spelling}"
        );
        let arg = format!("--{key}={spelling}");
        let cfg = RelayConfig::merge(&Settings::default(), &flags(&[&arg])).unwrap();
        assert_eq!(cfg, defaults, "{arg}");
        let file = Settings::from_toml(&format!("{key} = {spelling}"), Path::new("t.toml"))
            .or_else(|_| Settings::from_toml(&format!("{key} = {spelling:?}"), Path::new("t.toml")))
            .unwrap_or_else(|e| panic!("{key} = {spelling}: {e}"));
        let cfg = RelayConfig::merge(&file, &Settings::default()).unwrap();
        assert_eq!(cfg, defaults, "{key} = {spelling} in the file");
    }

    // The relay's README lists every key; no README's flag table names a
    // key that does not exist, and a default it gives is the declared one.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let relay_readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let root_readme = std::fs::read_to_string(dir.join("../../README.md")).unwrap();
    let listed: BTreeSet<String> = readme_rows(&relay_readme)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for key in &keys {
        assert!(
            listed.contains(key),
            "backends/relay/README.md lacks --{key}"
        );
    }
    for (readme, text) in [
        ("backends/relay/README.md", &relay_readme),
        ("README.md", &root_readme),
    ] {
        for (name, default) in readme_rows(text) {
            assert!(
                unique.contains(name.as_str()) || name == "config",
                "{readme} lists --{name}, which is no setting"
            );
            let field = name.replace('-', "_");
            if let Some(spelling) = Settings::default_spelling(&field) {
                assert!(
                    default.split_whitespace().next() == Some(spelling.as_str()),
                    "{readme}: --{name}'s default is {spelling}, not {default}"
                );
            }
        }
    }
}

#[test]
fn quotas_name_their_keys() {
    use skiff_core::relay::Quota;
    let keys: Vec<String> = Settings::keys().collect();
    for quota in [
        Quota::Announces,
        Quota::PendingTracks,
        Quota::PendingTracksPerBroadcast,
        Quota::RelayTracks,
    ] {
        let key = quota_key(quota);
        assert!(keys.iter().any(|k| k == key), "{quota}: {key}");
    }
}

#[test]
fn default_spellings() {
    assert_eq!(ByteSize::mib(256).spelling(), "256MiB");
    assert_eq!(ByteSize(1536 << 10).spelling(), "1536KiB");
    assert_eq!(ByteSize(1 << 30).spelling(), "1GiB");
    assert_eq!(ByteSize(1000).spelling(), "1000");
    assert_eq!(ByteSize(0).spelling(), "0");
    assert_eq!(DurationArg::secs(10).spelling(), "10s");
    assert_eq!(DurationArg(Duration::from_millis(250)).spelling(), "250ms");
    for d in [DriverKind::Auto, DriverKind::IoUring, DriverKind::Legacy] {
        assert_eq!(d.spelling().parse::<DriverKind>(), Ok(d));
    }
}

#[test]
fn file_keys_in_either_spelling_once() {
    let p = Path::new("t.toml");
    let s = Settings::from_toml("max_relay_tracks = 5\nmax-announces = 6\n", p).unwrap();
    assert_eq!((s.max_relay_tracks, s.max_announces), (Some(5), Some(6)));
    let err = Settings::from_toml("max_streams = 5\nmax-streams = 6\n", p).unwrap_err();
    assert!(err.to_string().contains("max-streams"), "{err}");
}

#[test]
fn cluster_settings_from_flags_and_file() {
    let cfg = RelayConfig::merge(
        &Settings::default(),
        &flags(&[
            "--cluster-connect",
            "tcp://a:1/?jwt=T1,tcp://b:2/?cost=3",
            "--cluster-connect",
            "moql://c:3/live",
            "--cluster-id",
            "42",
            "--cluster-max-hops",
            "8",
            "--cluster-node",
            "tcp://b:2/",
        ]),
    )
    .unwrap();
    let keys: Vec<String> = cfg.cluster_connect.iter().map(|p| p.key()).collect();
    assert_eq!(keys, ["tcp://a:1/", "moql://c:3/live"], "own node skipped");
    assert_eq!(cfg.cluster_connect[0].token.as_deref(), Some("T1"));
    assert_eq!((cfg.cluster_id, cfg.cluster_max_hops), (Some(42), 8));
    assert!(!format!("{cfg:?}").contains("T1"), "Debug hides tokens");

    let file = Settings::from_toml(
        "cluster-connect = [\"tcp://a:1/\", { url = \"tcp://b:2/\", cost = 2, token = \"T2\" }]\ncluster_id = 7\ncluster-connect-api = \"peers.json\"\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let cfg = RelayConfig::merge(&file, &Settings::default()).unwrap();
    assert_eq!(cfg.cluster_connect.len(), 2);
    assert_eq!(cfg.cluster_connect[1].cost, Some(2));
    assert_eq!(cfg.cluster_id, Some(7));
    assert_eq!(
        cfg.cluster_connect_api,
        Some(PeerListSource::File("peers.json".into()))
    );
    assert_eq!(RelayConfig::default().cluster_max_hops, 32);
    assert_eq!(RelayConfig::default().cluster_id, None);

    for (args, key) in [
        (&["--cluster-id", "0"][..], "cluster-id"),
        (&["--cluster-id", "4611686018427387904"], "cluster-id"),
        (&["--cluster-max-hops", "0"], "cluster-max-hops"),
        (&["--cluster-max-hops", "33"], "cluster-max-hops"),
        (&["--cluster-token", "/nonexistent/t.jwt"], "cluster-token"),
        (
            &["--cluster-connect", "tcp://a:1/?jwt=A,tcp://a:1/?jwt=B"],
            "cluster-connect",
        ),
    ] {
        let e = RelayConfig::merge(&Settings::default(), &flags(args)).unwrap_err();
        assert!(e.to_string().contains(key), "{args:?}: {e}");
        assert!(!e.to_string().contains("jwt=A"), "{args:?}: {e}");
    }
    for bad in [
        "cluster-connect = [{ url = \"tcp://b:2/\", colour = 1 }]",
        "cluster-connect = [\"b:2\"]",
        "cluster-max-hops = -1",
    ] {
        assert!(
            Settings::from_toml(bad, Path::new("t.toml")).is_err(),
            "{bad}"
        );
    }
}
