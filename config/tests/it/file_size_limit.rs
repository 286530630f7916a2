//! Configuration files are read with a size limit (issue 10, item 9): a
//! file larger than 4 MiB (a runaway ConfigMap, a path pointing at a device
//! or a FIFO) is refused with an error naming the file and the limit, by
//! the first load and by the hot-reload watcher, without reading it all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringway_config::{ConfigWatcher, MeshConfig, NoEnv};
use ringway_testbed::{wait_for, TempDir};

/// Valid YAML just over the limit: a long comment, then a valid setting.
fn oversized() -> String {
    format!("# {}\nproxy:\n  workers: 1\n", "x".repeat(4 * 1024 * 1024))
}

#[test]
fn adversarial_oversized_config_file_is_refused() {
    let d = TempDir::new("config-oversized");
    let path = d.join("config.yaml");
    std::fs::write(&path, oversized()).unwrap();
    let e = MeshConfig::load(Some(&path), &NoEnv).expect_err("a config file over 4 MiB was loaded");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: larger than the limit of 4194304 bytes (4 MiB); refusing to read it",
            path.display()
        )
    );
    // Not a regular file either: a device is cut off at the limit.
    let e = MeshConfig::load(Some(std::path::Path::new("/dev/zero")), &NoEnv)
        .expect_err("/dev/zero was loaded");
    assert!(
        e.to_string()
            .starts_with("/dev/zero: larger than the limit of 4194304 bytes"),
        "{e}"
    );
    // The watcher refuses it at start, and on a later edit keeps the last
    // good snapshot and reports the file and the limit.
    let e = ConfigWatcher::spawn(path.clone(), NoEnv, |_| {}, |_| {})
        .expect_err("the watcher started on an oversized file");
    assert!(
        e.to_string()
            .contains("larger than the limit of 4194304 bytes"),
        "{e}"
    );
    std::fs::write(&path, "proxy:\n  workers: 2\n").unwrap();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = errors.clone();
    let w = ConfigWatcher::spawn_with_interval(
        path.clone(),
        NoEnv,
        Duration::from_millis(20),
        |_| {},
        move |e| seen.lock().unwrap().push(e.to_string()),
    )
    .unwrap();
    std::fs::write(&path, oversized()).unwrap();
    wait_for(
        "an error reported for the oversized edit",
        Duration::from_secs(20),
        || !errors.lock().unwrap().is_empty(),
    );
    let got = errors.lock().unwrap().clone();
    assert!(
        got[0].contains("larger than the limit of 4194304 bytes"),
        "{got:?}"
    );
    assert_eq!(
        w.current().proxy().workers,
        2,
        "the last good snapshot stays"
    );
}
