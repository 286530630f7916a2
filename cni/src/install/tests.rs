//! The installer against real files in a scratch dir: which file is primary,
//! the entry kept last and alone, wrapping a single-plugin config, malformed
//! configs named exactly, atomic writes, uninstall, and the watch.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

/// A fresh dir with `net.d`, `bin` and a plugin binary to install.
struct TempDir(ringway_testbed::TempDir);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir = ringway_testbed::TempDir::new(&format!("install-{test}"));
        fs::create_dir_all(dir.join("net.d")).unwrap();
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("plugin"), b"#!/bin/sh\necho ringway\n").unwrap();
        TempDir(dir)
    }

    fn conf(&self) -> PathBuf {
        self.0.join("net.d")
    }

    fn conf_file(&self, name: &str) -> PathBuf {
        self.conf().join(name)
    }

    fn write(&self, name: &str, v: &Value) -> PathBuf {
        let p = self.conf_file(name);
        fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
        p
    }

    fn installer(&self) -> Installer {
        let mut c = InstallConfig::new(self.0.join("plugin"));
        c.bin_dir = self.0.join("bin");
        c.conf_dir = self.conf();
        c.agent_socket = PathBuf::from("/run/ringway/test.sock");
        c.log_level = LogLevel::Debug;
        Installer::new(c)
    }

    /// Names in the conf dir, sorted (temp files included: none may be left over).
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.conf())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

fn ours() -> Value {
    json!({"type": "ringway-cni", "agentSocket": "/run/ringway/test.sock", "logLevel": "debug"})
}

fn calico_list() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "disableCheck": false,
        "x-vendor": {"keep": [1, 2.5, "three"]},
        "plugins": [
            {"type": "calico", "ipam": {"type": "calico-ipam"}, "policy": {"type": "k8s"}},
            {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
        ]
    })
}

fn with_plugins(mut list: Value, plugins: Vec<Value>) -> Value {
    list["plugins"] = Value::Array(plugins);
    list
}

/// How long a watch may take to see a change.
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn conflist_gets_our_entry_last_and_keeps_everything_else() {
    let t = TempDir::new("conflist");
    let p = t.write("10-calico.conflist", &calico_list());
    let got = t.installer().ensure_entry().unwrap();
    assert_eq!(
        got,
        Installed {
            path: p.clone(),
            change: Change::Inserted
        }
    );
    let orig = calico_list();
    let mut plugins = orig["plugins"].as_array().unwrap().clone();
    plugins.push(ours());
    assert_eq!(read_json(&p), with_plugins(orig, plugins));
    assert_eq!(t.listing(), ["10-calico.conflist"]);
}

#[test]
fn second_ensure_writes_nothing() {
    let t = TempDir::new("idempotent");
    let p = t.write("10-calico.conflist", &calico_list());
    let inst = t.installer();
    inst.ensure_entry().unwrap();
    let before = fs::metadata(&p).unwrap();
    let bytes = fs::read(&p).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..3 {
        assert_eq!(inst.ensure_entry().unwrap().change, Change::Unchanged);
    }
    let after = fs::metadata(&p).unwrap();
    assert_eq!(fs::read(&p).unwrap(), bytes);
    // Same inode and mtime: not even rewritten with equal content.
    assert_eq!(before.ino(), after.ino());
    assert_eq!(before.mtime_nsec(), after.mtime_nsec());
    let plugins = read_json(&p)["plugins"].as_array().unwrap().clone();
    assert_eq!(
        plugins
            .iter()
            .filter(|p| p["type"] == "ringway-cni")
            .count(),
        1
    );
}

#[test]
fn conf_is_wrapped_into_a_conflist_and_removed() {
    let t = TempDir::new("wrap");
    let conf = t.write(
        "10-flannel.conf",
        &json!({
            "cniVersion": "0.3.1",
            "name": "cbr0",
            "type": "flannel",
            "delegate": {"hairpinMode": true, "isDefaultGateway": true}
        }),
    );
    fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).unwrap();
    let got = t.installer().ensure_entry().unwrap();
    let list = t.conf_file("10-flannel.conflist");
    assert_eq!(
        got,
        Installed {
            path: list.clone(),
            change: Change::Wrapped { from: conf.clone() }
        }
    );
    assert_eq!(
        read_json(&list),
        json!({
            "cniVersion": "0.3.1",
            "name": "cbr0",
            "plugins": [
                {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
                ours()
            ]
        })
    );
    assert_eq!(t.listing(), ["10-flannel.conflist"]);
    // The original's permission bits carry over.
    assert_eq!(
        fs::metadata(&list).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        t.installer().ensure_entry().unwrap().change,
        Change::Unchanged
    );
}

#[test]
fn single_plugin_json_is_wrapped_too() {
    let t = TempDir::new("json");
    t.write(
        "05-bridge.json",
        &json!({"cniVersion": "1.0.0", "name": "br", "type": "bridge", "bridge": "cni0"}),
    );
    let got = t.installer().ensure_entry().unwrap();
    assert_eq!(got.path, t.conf_file("05-bridge.conflist"));
    assert_eq!(
        read_json(&got.path)["plugins"],
        json!([{"type": "bridge", "bridge": "cni0"}, ours()])
    );
    assert_eq!(t.listing(), ["05-bridge.conflist"]);
}

#[test]
fn the_first_file_in_lexical_order_is_the_primary() {
    let t = TempDir::new("order");
    let other = with_plugins(calico_list(), vec![json!({"type": "other"})]);
    t.write("20-b.conflist", &other);
    t.write("10-a.conflist", &calico_list());
    t.write("99-z.conf", &json!({"name": "z", "type": "z"}));
    fs::write(t.conf_file("00-readme.txt"), "not a config").unwrap();
    fs::write(t.conf_file(".00-old.conflist.ringway-tmp"), "half").unwrap();
    fs::create_dir(t.conf_file("01-dir.conflist")).unwrap();
    assert_eq!(
        primary_conf(&t.conf()).unwrap(),
        t.conf_file("10-a.conflist")
    );
    // Byte order: upper case before lower case, `.conf` before `.conflist` of a stem.
    t.write("10-Z.conflist", &other);
    assert_eq!(
        primary_conf(&t.conf()).unwrap(),
        t.conf_file("10-Z.conflist")
    );
    t.write("10-Z.conf", &json!({"name": "z", "type": "z"}));
    assert_eq!(primary_conf(&t.conf()).unwrap(), t.conf_file("10-Z.conf"));
    // (Wrapping `10-Z.conf` would overwrite the foreign `10-Z.conflist`: see
    // `wrap_refuses_to_overwrite_a_foreign_conflist`.)
    fs::remove_file(t.conf_file("10-Z.conflist")).unwrap();

    let got = t.installer().ensure_entry().unwrap();
    assert_eq!(got.path, t.conf_file("10-Z.conflist"));
    assert!(matches!(got.change, Change::Wrapped { .. }));
    // The others are untouched.
    assert_eq!(read_json(&t.conf_file("10-a.conflist")), calico_list());
    assert_eq!(read_json(&t.conf_file("20-b.conflist")), other);
}

#[test]
fn an_entry_of_ours_in_the_middle_is_moved_last_and_updated() {
    let t = TempDir::new("middle");
    let stale = json!({"type": "ringway-cni", "agentSocket": "/old.sock", "logLevel": "warn"});
    let calico = json!({"type": "calico"});
    let portmap = json!({"type": "portmap"});
    let p = t.write(
        "10-calico.conflist",
        &with_plugins(calico_list(), vec![calico.clone(), stale, portmap.clone()]),
    );
    let got = t.installer().ensure_entry().unwrap();
    assert_eq!(got.change, Change::Updated);
    assert_eq!(read_json(&p)["plugins"], json!([calico, portmap, ours()]));
}

#[test]
fn duplicate_entries_collapse_to_one_last() {
    let t = TempDir::new("dup");
    let calico = json!({"type": "calico"});
    let p = t.write(
        "10-calico.conflist",
        &with_plugins(calico_list(), vec![ours(), calico.clone(), ours()]),
    );
    assert_eq!(
        t.installer().ensure_entry().unwrap().change,
        Change::Updated
    );
    assert_eq!(read_json(&p)["plugins"], json!([calico, ours()]));
}

#[test]
fn an_entry_with_other_settings_is_replaced_in_place() {
    let t = TempDir::new("settings");
    let calico = json!({"type": "calico"});
    let old = json!({"type": "ringway-cni", "agentSocket": "/run/ringway/test.sock", "logLevel": "warn", "excludeNamespaces": ["x"]});
    let p = t.write(
        "10-calico.conflist",
        &with_plugins(calico_list(), vec![calico.clone(), old]),
    );
    assert_eq!(
        t.installer().ensure_entry().unwrap().change,
        Change::Updated
    );
    assert_eq!(read_json(&p)["plugins"], json!([calico, ours()]));
}

/// Each malformed primary config gives an error that names the file and the problem
/// (`{}` stands for the file's path).
#[test]
fn malformed_configs_give_exact_errors() {
    let cases = [
        (
            "10-a.conflist",
            "{not json",
            "CNI config {} is not JSON: key must be a string at line 1 column 2",
        ),
        (
            "10-a.conflist",
            "",
            "CNI config {} is not JSON: EOF while parsing a value at line 1 column 0",
        ),
        (
            "10-a.conflist",
            "[1,2]",
            "CNI config {} is a JSON array, expected an object",
        ),
        (
            "10-a.conflist",
            r#"{"name":"n"}"#,
            "CNI config list {} has no \"plugins\" array",
        ),
        (
            "10-a.conflist",
            r#"{"name":"n","plugins":{}}"#,
            "CNI config list {} has no \"plugins\" array",
        ),
        (
            "10-a.conflist",
            r#"{"name":"n","plugins":[{"type":"a"},"b"]}"#,
            "CNI config list {}: plugins[1] is a JSON string, expected an object",
        ),
        (
            "10-a.conf",
            r#"{"name":"n"}"#,
            "CNI config {} has no string \"type\" (a single-plugin config needs one)",
        ),
        (
            "10-a.conf",
            r#"{"name":"n","plugins":[{"type":"a"}]}"#,
            "CNI config {} has no string \"type\" (a single-plugin config needs one)",
        ),
        (
            "10-a.json",
            r#"{"type":"bridge"}"#,
            "CNI config {} has no string \"name\" (a single-plugin config needs one)",
        ),
        (
            "10-a.conf",
            "null",
            "CNI config {} is a JSON null, expected an object",
        ),
    ];
    for (name, content, want) in cases {
        let t = TempDir::new("malformed");
        let p = t.conf_file(name);
        fs::write(&p, content).unwrap();
        let err = t.installer().ensure_entry().unwrap_err();
        assert_eq!(
            err.to_string(),
            want.replace("{}", &p.display().to_string()),
            "{name}: {content}"
        );
        // Nothing was written or removed.
        assert_eq!(fs::read_to_string(&p).unwrap(), content);
        assert_eq!(t.listing(), [name]);
    }
}

#[test]
fn missing_or_empty_conf_dir_is_named() {
    let t = TempDir::new("empty");
    fs::write(t.conf_file("README"), "x").unwrap();
    let err = t.installer().ensure_entry().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no CNI network config (*.conflist, *.conf, *.json) in {}",
            t.conf().display()
        )
    );
    fs::remove_dir_all(t.conf()).unwrap();
    let err = t.installer().ensure_entry().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot list CNI conf dir {}: No such file or directory (os error 2)",
            t.conf().display()
        )
    );
}

#[test]
fn wrap_refuses_to_overwrite_a_foreign_conflist() {
    let t = TempDir::new("foreign");
    let conf = t.write("10-x.conf", &json!({"name": "x", "type": "x"}));
    let list = t.write("10-x.conflist", &calico_list());
    let err = t.installer().ensure_entry().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot wrap CNI config {}: {} exists and was not written by ringway",
            conf.display(),
            list.display()
        )
    );
    assert_eq!(read_json(&list), calico_list());
}

#[test]
fn a_rewritten_conf_is_wrapped_again_over_our_old_conflist() {
    // flannel rewrites its `.conf` after we wrapped it: both exist, the `.conf` sorts
    // first, and our own `.conflist` is replaced by a wrap of the new content.
    let t = TempDir::new("rewrap");
    t.write(
        "10-flannel.conf",
        &json!({"name": "cbr0", "type": "flannel", "v": 1}),
    );
    let inst = t.installer();
    inst.ensure_entry().unwrap();
    t.write(
        "10-flannel.conf",
        &json!({"name": "cbr0", "type": "flannel", "v": 2}),
    );
    let got = inst.ensure_entry().unwrap();
    assert!(matches!(got.change, Change::Wrapped { .. }));
    assert_eq!(
        read_json(&got.path)["plugins"],
        json!([{"type": "flannel", "v": 2}, ours()])
    );
    assert_eq!(t.listing(), ["10-flannel.conflist"]);
}

#[test]
fn check_reports_whether_the_entry_is_in_place() {
    let t = TempDir::new("check");
    let p = t.write("10-calico.conflist", &calico_list());
    let inst = t.installer();
    assert_eq!(
        inst.check().unwrap_err().to_string(),
        format!(
            "CNI config {} does not have the ringway-cni entry as its last plugin",
            p.display()
        )
    );
    inst.ensure_entry().unwrap();
    assert_eq!(inst.check().unwrap(), p);
}

#[test]
fn binary_is_copied_executable_and_replaced_atomically() {
    let t = TempDir::new("binary");
    let inst = t.installer();
    let to = inst.install_binary().unwrap();
    assert_eq!(to, t.0.join("bin/ringway-cni"));
    assert_eq!(
        fs::read(&to).unwrap(),
        fs::read(t.0.join("plugin")).unwrap()
    );
    assert_eq!(
        fs::metadata(&to).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let ino = fs::metadata(&to).unwrap().ino();

    // An upgrade: a new inode is renamed in (a running plugin keeps the old file).
    fs::write(t.0.join("plugin"), b"v2").unwrap();
    inst.install_binary().unwrap();
    assert_eq!(fs::read(&to).unwrap(), b"v2");
    assert_ne!(fs::metadata(&to).unwrap().ino(), ino);
    let names: Vec<_> = fs::read_dir(t.0.join("bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ringway-cni"]);

    fs::remove_file(t.0.join("plugin")).unwrap();
    let err = inst.install_binary().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot copy plugin binary {} to {}: No such file or directory (os error 2)",
            t.0.join("plugin").display(),
            to.display()
        )
    );
}

#[test]
fn uninstall_removes_only_our_entries_and_the_binary() {
    let t = TempDir::new("uninstall");
    let p = t.write("10-calico.conflist", &calico_list());
    // A second file that also has us (an older primary), and a broken one.
    let old = t.write(
        "20-old.conflist",
        &with_plugins(calico_list(), vec![json!({"type": "x"}), ours()]),
    );
    fs::write(t.conf_file("30-broken.conflist"), "{").unwrap();
    let inst = t.installer();
    inst.install().unwrap();
    assert!(t.0.join("bin/ringway-cni").exists());

    let done = inst.uninstall().unwrap();
    assert_eq!(
        done,
        Uninstalled {
            files: vec![p.clone(), old.clone()],
            binary_removed: true
        }
    );
    assert_eq!(read_json(&p), calico_list());
    assert_eq!(read_json(&old)["plugins"], json!([{"type": "x"}]));
    assert_eq!(
        fs::read_to_string(t.conf_file("30-broken.conflist")).unwrap(),
        "{"
    );
    assert!(!t.0.join("bin/ringway-cni").exists());
    // Again: nothing left to do.
    assert_eq!(inst.uninstall().unwrap(), Uninstalled::default());
}

#[test]
fn uninstall_after_a_wrap_leaves_the_original_plugin_alone() {
    let t = TempDir::new("unwrap");
    t.write(
        "10-flannel.conf",
        &json!({"cniVersion": "1.0.0", "name": "cbr0", "type": "flannel"}),
    );
    let inst = t.installer();
    inst.install().unwrap();
    inst.uninstall().unwrap();
    assert_eq!(
        read_json(&t.conf_file("10-flannel.conflist")),
        json!({"cniVersion": "1.0.0", "name": "cbr0", "plugins": [{"type": "flannel"}]})
    );
}

#[test]
fn a_write_is_abandoned_when_the_target_changed_under_it() {
    let t = TempDir::new("expect");
    let p = t.conf_file("a.conflist");
    fs::write(&p, "new content from the primary CNI").unwrap();
    assert!(!write_atomic(&p, b"ours", 0o644, Some(b"what we read")).unwrap());
    assert_eq!(fs::read(&p).unwrap(), b"new content from the primary CNI");
    assert_eq!(t.listing(), ["a.conflist"]);
    assert!(write_atomic(
        &p,
        b"ours",
        0o644,
        Some(b"new content from the primary CNI")
    )
    .unwrap());
    assert_eq!(fs::read(&p).unwrap(), b"ours");
}

/// The primary CNI rewrites its file (by rename, and in place): the watch puts our entry
/// back. The re-check interval is an hour, so only inotify can have woken it.
#[test]
fn watch_reinserts_after_the_primary_rewrites_its_file() {
    let t = TempDir::new("watch");
    let p = t.write("10-calico.conflist", &calico_list());
    let mut inst = t.installer();
    inst.config.recheck_interval = Duration::from_secs(3600);
    let watch = inst.watch().unwrap();
    ringway_testbed::wait_for("initial insert", WAIT, || inst.check().is_ok());

    // Rewrite by rename, as most CNIs do.
    let tmp = t.conf_file("calico.tmp");
    fs::write(&tmp, serde_json::to_vec(&calico_list()).unwrap()).unwrap();
    fs::rename(&tmp, &p).unwrap();
    ringway_testbed::wait_for("re-insert after rename", WAIT, || inst.check().is_ok());

    // Rewrite in place.
    fs::write(&p, serde_json::to_vec(&calico_list()).unwrap()).unwrap();
    ringway_testbed::wait_for("re-insert after in-place write", WAIT, || {
        inst.check().is_ok()
    });

    let mut want = calico_list();
    want["plugins"].as_array_mut().unwrap().push(ours());
    assert_eq!(read_json(&p), want);

    let started = Instant::now();
    watch.stop();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        started.elapsed()
    );

    // Stopped: a rewrite now stays as the primary wrote it.
    fs::write(&p, serde_json::to_vec(&calico_list()).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(read_json(&p), calico_list());
}

/// Node boot: the agent starts before the primary CNI wrote anything.
#[test]
fn watch_installs_when_the_primary_config_appears() {
    let t = TempDir::new("late");
    let mut inst = t.installer();
    inst.config.recheck_interval = Duration::from_secs(3600);
    let watch = inst.watch().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    t.write(
        "10-flannel.conf",
        &json!({"name": "cbr0", "type": "flannel"}),
    );
    ringway_testbed::wait_for("wrap of the late .conf", WAIT, || inst.check().is_ok());
    assert_eq!(t.listing(), ["10-flannel.conflist"]);
    drop(watch);
}

#[test]
fn watch_falls_back_to_the_recheck_interval() {
    let t = TempDir::new("recheck");
    let p = t.write("10-calico.conflist", &calico_list());
    let mut inst = t.installer();
    inst.config.recheck_interval = Duration::from_millis(50);
    let watch = inst.watch().unwrap();
    ringway_testbed::wait_for("initial insert", WAIT, || inst.check().is_ok());
    // The conf dir is removed and made again: the inotify watch is gone with it, the
    // periodic re-check still finds the new file.
    fs::remove_dir_all(t.conf()).unwrap();
    fs::create_dir(t.conf()).unwrap();
    t.write("10-calico.conflist", &calico_list());
    ringway_testbed::wait_for("re-insert by re-check", WAIT, || inst.check().is_ok());
    assert_eq!(
        read_json(&p)["plugins"].as_array().unwrap().last(),
        Some(&ours())
    );
    watch.stop();
}

#[test]
fn watch_of_a_missing_dir_is_an_error() {
    let t = TempDir::new("nodir");
    fs::remove_dir_all(t.conf()).unwrap();
    let err = t.installer().watch().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot watch CNI conf dir {}: No such file or directory (os error 2)",
            t.conf().display()
        )
    );
}

#[test]
fn a_configured_log_file_goes_into_our_entry() {
    let mut c = InstallConfig::new("/bin/ringway");
    assert!(!c.entry().contains_key("logFile"), "no logFile by default");
    c.log_file = Some(PathBuf::from("/var/log/ringway-cni.log"));
    assert_eq!(
        c.entry().get("logFile"),
        Some(&json!("/var/log/ringway-cni.log"))
    );
    // And the plugin reads it back as its log file.
    let mut entry = c.entry();
    entry.insert("cniVersion".into(), json!("1.0.0"));
    entry.insert("name".into(), json!("k8s-pod-network"));
    let conf = crate::NetConf::parse(&serde_json::to_vec(&entry).unwrap()).unwrap();
    assert_eq!(
        conf.log_file,
        Some(PathBuf::from("/var/log/ringway-cni.log"))
    );
    assert!(conf.unknown_keys().is_empty(), "{:?}", conf.unknown_keys());
}
