//! The binaries the emulated runs execute: the workspace's test binaries and examples as
//! `cargo test --workspace` builds them, found in cargo's JSON messages.
//!
//! Invariants: the build is exactly CI's test step's (`cargo test --workspace`, dev profile, same
//! features), plus `--no-run`, so after that step nothing is rebuilt; every binary keeps the
//! cargo command that runs it alone ([`Built::cargo_command`]), for logs and for people; xtask's
//! own tests are left out (they check this machine, not CUDA).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::gpu_pack::{package_name, rendered_errors};

/// One executable cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The package, e.g. `kiln-device`.
    pub package: String,
    /// `lib`, `test`, `bin` or `example`.
    pub kind: String,
    /// The target's name, e.g. `cuda_ops`.
    pub target: String,
    /// Where cargo put it.
    pub path: PathBuf,
    /// The package's folder (cargo runs tests from there).
    pub package_dir: PathBuf,
}

impl Built {
    /// A short unique name: `kiln-device`, `kiln-device--test-cuda_ops`, `kiln--example-train`.
    pub fn name(&self) -> String {
        if self.kind == "lib" {
            self.package.clone()
        } else {
            format!("{}--{}-{}", self.package, self.kind, self.target)
        }
    }

    /// The cargo command that builds and runs this binary alone.
    pub fn cargo_command(&self) -> String {
        match self.kind.as_str() {
            "lib" => format!("cargo test -p {} --lib", self.package),
            "example" => format!("cargo run -p {} --example {}", self.package, self.target),
            kind => format!("cargo test -p {} --{kind} {}", self.package, self.target),
        }
    }
}

/// Runs `cargo test --workspace --no-run --message-format=json` and lists what it built: test
/// binaries (`profile.test`) and examples.
pub fn build_workspace(root: &Path) -> Result<Vec<Built>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(&cargo)
        .current_dir(root)
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run `{cargo} test`: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        for text in rendered_errors(&stdout) {
            eprint!("{text}");
        }
        return Err(format!(
            "`cargo test --workspace --no-run` failed ({}); see the errors above",
            output.status
        ));
    }
    parse_built(&stdout)
}

/// The test executables and examples in cargo's JSON messages, xtask's left out, sorted by name.
pub fn parse_built(messages: &str) -> Result<Vec<Built>, String> {
    let mut out: Vec<Built> = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("cannot parse cargo's JSON message `{line}`: {e}"))?;
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(path) = message["executable"].as_str() else {
            continue;
        };
        let kind = message["target"]["kind"][0]
            .as_str()
            .unwrap_or("test")
            .to_string();
        if message["profile"]["test"] != true && kind != "example" {
            continue;
        }
        let package = package_name(message["package_id"].as_str().unwrap_or_default());
        if package == "xtask" {
            continue;
        }
        let manifest = PathBuf::from(message["manifest_path"].as_str().unwrap_or_default());
        let built = Built {
            package,
            kind,
            target: message["target"]["name"]
                .as_str()
                .unwrap_or("unknown")
                .to_string(),
            path: PathBuf::from(path),
            package_dir: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        };
        if !out.iter().any(|b| b.name() == built.name()) {
            out.push(built);
        }
    }
    out.sort_by_key(Built::name);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_and_examples_are_listed_with_their_cargo_commands() {
        let messages = [
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","manifest_path":"/w/crates/device/Cargo.toml","target":{"kind":["lib"],"name":"kiln_device"},"profile":{"test":true},"executable":"/t/deps/kiln_device-1"}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","manifest_path":"/w/crates/device/Cargo.toml","target":{"kind":["test"],"name":"cuda_ops"},"profile":{"test":true},"executable":"/t/deps/cuda_ops-2"}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/kiln#kiln@0.1.0","manifest_path":"/w/crates/kiln/Cargo.toml","target":{"kind":["example"],"name":"train"},"profile":{"test":false},"executable":"/t/examples/train"}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","manifest_path":"/w/crates/device/Cargo.toml","target":{"kind":["lib"],"name":"kiln_device"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/xtask#0.1.0","manifest_path":"/w/xtask/Cargo.toml","target":{"kind":["bin"],"name":"xtask"},"profile":{"test":true},"executable":"/t/deps/xtask-3"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        let got = parse_built(&messages).unwrap();
        let names: Vec<String> = got.iter().map(Built::name).collect();
        assert_eq!(
            names,
            [
                "kiln--example-train",
                "kiln-device",
                "kiln-device--test-cuda_ops"
            ]
        );
        let commands: Vec<String> = got.iter().map(Built::cargo_command).collect();
        assert_eq!(
            commands,
            [
                "cargo run -p kiln --example train",
                "cargo test -p kiln-device --lib",
                "cargo test -p kiln-device --test cuda_ops",
            ]
        );
        assert_eq!(got[1].package_dir, PathBuf::from("/w/crates/device"));
    }
}
