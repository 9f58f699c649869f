//! `host rl --help` is generated from the configuration's types: a snapshot pins what users
//! read (regenerate with `RLHOST_UPDATE_SNAPSHOTS=1` after changing a key or its doc, and read
//! the diff). Keys that do not apply are refused by the binary with the key's name.

use crate::common;

#[test]
fn rl_help_matches_its_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let help = common::run_ok(common::host(tmp.path()).args(["rl", "--help"]));
    let short = common::run_ok(common::host(tmp.path()).args(["rl", "-h"]));
    assert_eq!(help, short);
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/snapshots/rl-help.txt");
    if std::env::var_os("RLHOST_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &help).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        help == want,
        "`host rl --help` differs from {} (RLHOST_UPDATE_SNAPSHOTS=1 rewrites it):\n{help}",
        path.display()
    );
    for key in [
        "--trainer.loss.kl-coef <FLOAT>",
        "--orchestrator.eval.interval <INT>",
    ] {
        assert!(help.contains(key), "{key}");
    }
}

#[test]
fn keys_that_do_not_apply_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, key) in [
        (vec!["--inference.port", "9000"], "inference.port"),
        (
            vec![
                "--orchestrator.client.base-urls",
                "[\"http://127.0.0.1:9\"]",
                "--inference.max-batch-size",
                "4",
            ],
            "inference.max_batch_size",
        ),
        (vec!["--inference.dtype", "f16"], "dtype"),
    ] {
        let mut cmd = common::host(tmp.path());
        cmd.args(["rl", "--model.name", "/m"]).args(&args);
        let err = common::run_err(&mut cmd);
        assert!(err.contains(key), "{args:?}: {err}");
    }
}
