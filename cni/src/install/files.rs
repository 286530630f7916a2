//! The conf dir's files, below the installer: which file is the primary
//! config, reading and checking the JSON, and atomic writes (temp file,
//! fsync, rename, fsync of the dir). Uses only the installer's errors.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::InstallError;

/// The plugin's `type`, and its binary's name in the CNI bin dir.
pub const PLUGIN_TYPE: &str = "ringway-cni";
/// The extensions of network config files, as libcni and containerd list them.
pub const CONF_EXTENSIONS: [&str; 3] = ["conflist", "conf", "json"];
/// Suffix of our temp files: not an extension the runtime loads.
const TMP_SUFFIX: &str = ".ringway-tmp";

/// The primary config: the first conf file of `dir` in lexical order.
pub fn primary_conf(dir: &Path) -> Result<PathBuf, InstallError> {
    conf_files(dir)?
        .into_iter()
        .next()
        .ok_or_else(|| InstallError::NoConfFile {
            dir: dir.to_path_buf(),
        })
}

/// The conf files of `dir` (not directories; `.conflist`, `.conf`, `.json`), sorted.
pub(super) fn conf_files(dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let read_dir_err = |source| InstallError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir_err)? {
        let entry = entry.map_err(read_dir_err)?;
        let path = entry.path();
        let ext_ok = path
            .extension()
            .and_then(OsStr::to_str)
            .is_some_and(|e| CONF_EXTENSIONS.contains(&e));
        // `file_type` does not follow symlinks: like libcni, only directories are skipped.
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(true);
        if ext_ok && !is_dir {
            files.push(path);
        }
    }
    // Byte-wise order of the names, as the runtimes sort them.
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

pub(super) fn is_conflist(path: &Path) -> bool {
    path.extension() == Some(OsStr::new("conflist"))
}

pub(super) fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

pub(super) fn file_has_our_entry(path: &Path) -> bool {
    let Ok(bytes) = fs::read(path) else {
        return false;
    };
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(&bytes) else {
        return false;
    };
    matches!(doc.get("plugins"), Some(Value::Array(p)) if p.iter().any(is_ours))
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>, InstallError> {
    fs::read(path).map_err(|source| InstallError::Read {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn parse_object(path: &Path, bytes: &[u8]) -> Result<Map<String, Value>, InstallError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(InstallError::NotObject {
            path: path.to_path_buf(),
            found: json_type(&other),
        }),
        Err(source) => Err(InstallError::NotJson {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(super) fn plugins_mut<'a>(
    path: &Path,
    doc: &'a mut Map<String, Value>,
) -> Result<&'a mut Vec<Value>, InstallError> {
    let Some(Value::Array(plugins)) = doc.get_mut("plugins") else {
        return Err(InstallError::NoPlugins {
            path: path.to_path_buf(),
        });
    };
    if let Some((index, p)) = plugins.iter().enumerate().find(|(_, p)| !p.is_object()) {
        return Err(InstallError::PluginNotObject {
            path: path.to_path_buf(),
            index,
            found: json_type(p),
        });
    }
    Ok(plugins)
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(super) fn to_json(doc: &Map<String, Value>) -> Vec<u8> {
    // Serializing a `Map` of `Value`s cannot fail (string keys, no custom Serialize).
    let mut out = serde_json::to_vec_pretty(doc).unwrap_or_default();
    out.push(b'\n');
    out
}

pub(super) fn file_mode(path: &Path) -> Option<u32> {
    fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// `.<name>.ringway-tmp` beside `path`.
pub(super) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}{TMP_SUFFIX}"))
}

/// Writes `data` to `path` through a temp file and a rename. With `expect`, the rename
/// only happens if `path` still holds exactly those bytes; `Ok(false)` when it does not
/// (the temp file is removed and nothing changed).
pub(super) fn write_atomic(
    path: &Path,
    data: &[u8],
    mode: u32,
    expect: Option<&[u8]>,
) -> Result<bool, InstallError> {
    let tmp = temp_path(path);
    let write = || -> io::Result<bool> {
        let mut f = File::create(&tmp)?;
        f.write_all(data)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        if let Some(expect) = expect {
            if fs::read(path)? != expect {
                fs::remove_file(&tmp)?;
                return Ok(false);
            }
        }
        fs::rename(&tmp, path)?;
        sync_dir(path)?;
        Ok(true)
    };
    write().map_err(|source| {
        let _ = fs::remove_file(&tmp);
        InstallError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// fsyncs the directory holding `path`, so a rename or removal survives a crash.
pub(super) fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}
