//! `cargo xtask new-adapter NAME [--from TEMPLATE]`: a new adapter crate under
//! `adapters/NAME`, copied from a working adapter (default: the Stripe-format one) under
//! its new name, so it builds, loads and passes the conformance kit with the template's
//! fixtures from the first minute; a platform team then replaces the wire format module
//! by module (`docs/adapters.md`).

use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;

/// The adapter a new one is copied from unless `--from` names another.
pub const DEFAULT_TEMPLATE: &str = "stripe";
/// Files over this size are not templates (and would not be copied).
const MAX_TEMPLATE_FILE_BYTES: u64 = 4 << 20;

/// What to create.
#[derive(Debug, PartialEq, Eq)]
pub struct NewAdapter {
    pub name: String,
    pub template: String,
}

impl NewAdapter {
    pub fn parse(args: &[String]) -> Result<NewAdapter> {
        let mut name = None;
        let mut template = DEFAULT_TEMPLATE.to_string();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--from" => {
                    template = args.next().ok_or("--from needs an adapter name")?.clone();
                }
                other if other.starts_with('-') => return Err(format!("unknown option `{other}`")),
                other if name.is_none() => name = Some(other.to_string()),
                other => return Err(format!("unexpected argument `{other}`")),
            }
        }
        let name = name.ok_or("usage: cargo xtask new-adapter NAME [--from TEMPLATE]")?;
        check_name(&name)?;
        check_name(&template)?;
        Ok(NewAdapter { name, template })
    }
}

/// Adapter names are URL path segments and crate name suffixes.
fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid adapter name {name:?}: 1-64 of a-z, 0-9 and '-', starting with a letter"
        ))
    }
}

/// Creates `adapters_dir/<name>` from `adapters_dir/<template>`; the new directory.
pub fn create(adapters_dir: &Path, new: &NewAdapter) -> Result<PathBuf> {
    let from = adapters_dir.join(&new.template);
    let to = adapters_dir.join(&new.name);
    if !from.join("Cargo.toml").is_file() {
        return Err(format!("no adapter template at {}", from.display()));
    }
    if to.exists() {
        return Err(format!("{} exists already; nothing written", to.display()));
    }
    let renames = renames(&new.template, &new.name);
    copy_tree(&from, &to, &renames).inspect_err(|_| {
        // Leave nothing half-written behind.
        let _ = fs::remove_dir_all(&to);
    })?;
    Ok(to)
}

/// The template's identities and the new ones: package, crate and adapter name.
fn renames(template: &str, name: &str) -> Vec<(String, String)> {
    let snake = |n: &str| n.replace('-', "_");
    vec![
        (
            format!("sluice-adapter-{template}"),
            format!("sluice-adapter-{name}"),
        ),
        (
            format!("sluice_adapter_{}", snake(template)),
            format!("sluice_adapter_{}", snake(name)),
        ),
        (
            format!("ADAPTER_NAME: &str = \"{template}\""),
            format!("ADAPTER_NAME: &str = \"{name}\""),
        ),
    ]
}

fn copy_tree(from: &Path, to: &Path, renames: &[(String, String)]) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let entries = fs::read_dir(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", from.display()))?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            if entry.file_name() != "target" {
                copy_tree(&path, &target, renames)?;
            }
            continue;
        }
        copy_file(&path, &target, renames)?;
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path, renames: &[(String, String)]) -> Result<()> {
    let size = fs::metadata(from).map(|m| m.len()).unwrap_or(0);
    if size > MAX_TEMPLATE_FILE_BYTES {
        return Err(format!(
            "{} is over {MAX_TEMPLATE_FILE_BYTES} bytes",
            from.display()
        ));
    }
    let bytes = fs::read(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    let out = match String::from_utf8(bytes) {
        Ok(text) => renames
            .iter()
            .fold(text, |text, (old, new)| text.replace(old, new))
            .into_bytes(),
        Err(binary) => binary.into_bytes(),
    };
    fs::write(to, out).map_err(|e| format!("cannot write {}: {e}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_new_adapter_is_the_template_under_its_own_package_crate_and_adapter_name() {
        let dir = std::env::temp_dir().join(format!("xtask-new-adapter-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let template = dir.join("stripe");
        fs::create_dir_all(template.join("src")).unwrap();
        fs::write(
            template.join("Cargo.toml"),
            "[package]\nname = \"sluice-adapter-stripe\"\n",
        )
        .unwrap();
        fs::write(
            template.join("src/lib.rs"),
            "pub const ADAPTER_NAME: &str = \"stripe\";\nuse sluice_adapter_stripe::x;\n",
        )
        .unwrap();

        let new = NewAdapter::parse(&args(&["acme-pay"])).unwrap();
        let created = create(&dir, &new).unwrap();
        let manifest = fs::read_to_string(created.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("name = \"sluice-adapter-acme-pay\""),
            "{manifest}"
        );
        let lib = fs::read_to_string(created.join("src/lib.rs")).unwrap();
        assert!(lib.contains("ADAPTER_NAME: &str = \"acme-pay\""), "{lib}");
        assert!(lib.contains("sluice_adapter_acme_pay::x"), "{lib}");
        assert!(
            create(&dir, &new).is_err(),
            "an existing adapter is never overwritten"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_that_are_not_route_safe_are_refused() {
        for bad in ["", "Acme", "acme/pay", "9pay", "acme_pay"] {
            assert!(NewAdapter::parse(&args(&[bad])).is_err(), "{bad:?}");
        }
        assert!(NewAdapter::parse(&args(&["acme", "--from"])).is_err());
        assert_eq!(
            NewAdapter::parse(&args(&["acme", "--from", "adyen"])).unwrap(),
            NewAdapter {
                name: "acme".into(),
                template: "adyen".into()
            }
        );
    }
}
