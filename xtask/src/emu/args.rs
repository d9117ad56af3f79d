//! `cargo xtask emu`'s command line: the emulated machine's shape and the command to run.
//!
//! Invariants: parsing is pure (no environment, no files), so it is unit-tested; every flag is
//! validated here, so the emulator never sees a value it would have to reject; a flag left out
//! leaves the emulator's own default (or the caller's `KILN_EMU_*` variable) in place.

/// What `cargo xtask emu [FLAGS] -- CMD...` asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmuOptions {
    /// `--devices N`: emulated device count (`KILN_EMU_DEVICES`).
    pub devices: Option<u32>,
    /// `--memory BYTES`: capacity of each device in bytes (`KILN_EMU_MEMORY`).
    pub memory: Option<u64>,
    /// `--cc X.Y`: compute capability as `(major, minor)` (`KILN_EMU_CC`).
    pub compute_capability: Option<(u32, u32)>,
    /// `--delay`: random delays on stream work, so host/stream races reproduce (`KILN_EMU_DELAY`).
    pub delay: bool,
    /// The command and its arguments (everything after `--`).
    pub command: Vec<String>,
}

/// The most devices `--devices` accepts (a node has at most a handful; more is a typo).
pub const MAX_DEVICES: u32 = 64;

/// The flags, for usage messages.
pub const FLAGS_USAGE: &str = "[--devices N] [--memory BYTES] [--cc X.Y] [--delay] -- CMD...
  --devices N     emulated devices (0..=64)
  --memory BYTES  capacity of each device: bytes, or with a K/M/G/T suffix (powers of 1024)
  --cc X.Y        compute capability the devices report (e.g. 9.0)
  --delay         random delays on stream work, so host reads that race a stream show up";

impl EmuOptions {
    /// The `KILN_EMU_*` variables these options set (only those given).
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = Vec::new();
        if let Some(n) = self.devices {
            vars.push(("KILN_EMU_DEVICES", n.to_string()));
        }
        if let Some(bytes) = self.memory {
            vars.push(("KILN_EMU_MEMORY", bytes.to_string()));
        }
        if let Some((major, minor)) = self.compute_capability {
            vars.push(("KILN_EMU_CC", format!("{major}.{minor}")));
        }
        if self.delay {
            vars.push(("KILN_EMU_DELAY", "1".to_string()));
        }
        vars
    }
}

/// Parses the flags before `--` (`--flag value` or `--flag=value`) and takes everything after
/// `--` as the command; a command is required.
pub fn parse(args: &[String]) -> Result<EmuOptions, String> {
    parse_flags(args, true)
}

/// As [`parse`], but the command (and its `--`) may be absent: for tasks that choose their own
/// commands (`emu-suite`, `emu-mutants`) and take only the machine's shape.
pub fn parse_machine(args: &[String]) -> Result<EmuOptions, String> {
    let options = parse_flags(args, false)?;
    if let Some(first) = options.command.first() {
        return Err(format!(
            "unexpected `-- {first}`: this task chooses its own commands"
        ));
    }
    Ok(options)
}

fn parse_flags(args: &[String], need_command: bool) -> Result<EmuOptions, String> {
    let mut options = EmuOptions::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "--" {
            options.command = args[i + 1..].to_vec();
            if options.command.is_empty() {
                return Err("nothing to run after `--`".to_string());
            }
            return Ok(options);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg, None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i)
                .filter(|v| v.as_str() != "--")
                .cloned()
                .ok_or_else(|| format!("`{flag}` needs a value ({what})"))
        };
        match flag {
            "--devices" => options.devices = Some(parse_devices(&value("a device count")?)?),
            "--memory" => options.memory = Some(parse_bytes(&value("bytes per device")?)?),
            "--cc" => options.compute_capability = Some(parse_cc(&value("X.Y")?)?),
            "--delay" if inline.is_none() => options.delay = true,
            "--delay" => return Err("`--delay` takes no value".to_string()),
            other if other.starts_with('-') => {
                return Err(format!("unknown flag `{other}`"));
            }
            other => {
                return Err(format!(
                    "`{other}`: put the command after `--` (cargo xtask emu [FLAGS] -- {other} ...)"
                ));
            }
        }
        i += 1;
    }
    if need_command {
        return Err("no command: cargo xtask emu [FLAGS] -- CMD...".to_string());
    }
    Ok(options)
}

fn parse_devices(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if n <= MAX_DEVICES => Ok(n),
        _ => Err(format!(
            "`--devices {text}`: expected a whole number from 0 to {MAX_DEVICES}"
        )),
    }
}

/// Bytes, optionally with a `K`/`M`/`G`/`T` suffix (powers of 1024; `KiB`, `MB` etc. also read
/// as powers of 1024). Zero is refused: a device must hold something.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("`--memory {text}`: expected a positive byte count such as 1073741824, 512M or 2G")
    };
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    let bytes = number.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(bad());
    }
    Ok(bytes)
}

fn parse_cc(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`--cc {text}`: expected a compute capability MAJOR.MINOR such as 9.0");
    let (major, minor) = text.split_once('.').ok_or_else(bad)?;
    let digit = |s: &str| {
        (!s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    match (digit(major), digit(minor)) {
        (Some(major), Some(minor)) if major >= 1 => Ok((major, minor)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let got = parse(&strings(&[
            "--devices",
            "3",
            "--memory=2G",
            "--cc",
            "8.6",
            "--delay",
            "--",
            "cargo",
            "test",
            "--",
            "--nocapture",
        ]))
        .unwrap();
        assert_eq!(
            got,
            EmuOptions {
                devices: Some(3),
                memory: Some(2 << 30),
                compute_capability: Some((8, 6)),
                delay: true,
                command: strings(&["cargo", "test", "--", "--nocapture"]),
            }
        );
        assert_eq!(
            got.env_vars(),
            vec![
                ("KILN_EMU_DEVICES", "3".to_string()),
                ("KILN_EMU_MEMORY", (2u64 << 30).to_string()),
                ("KILN_EMU_CC", "8.6".to_string()),
                ("KILN_EMU_DELAY", "1".to_string()),
            ]
        );
    }

    #[test]
    fn flags_left_out_set_nothing() {
        let got = parse(&strings(&["--", "true"])).unwrap();
        assert_eq!(got.command, strings(&["true"]));
        assert!(got.env_vars().is_empty());
    }

    #[test]
    fn byte_counts_and_suffixes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        for bad in [
            "",
            "0",
            "0G",
            "-5",
            "1.5G",
            "12Q",
            "G",
            "99999999999999999999T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let err = |args: &[&str]| parse(&strings(args)).unwrap_err();
        assert!(err(&["--devices", "x", "--", "true"]).contains("--devices x"));
        assert!(err(&["--devices", "65", "--", "true"]).contains("0 to 64"));
        assert!(err(&["--devices"]).contains("needs a value"));
        assert!(err(&["--devices", "--", "true"]).contains("needs a value"));
        assert!(err(&["--memory", "lots", "--", "true"]).contains("--memory lots"));
        assert!(err(&["--cc", "9", "--", "true"]).contains("MAJOR.MINOR"));
        assert!(err(&["--cc", "9.x", "--", "true"]).contains("MAJOR.MINOR"));
        assert!(err(&["--cc", "0.5", "--", "true"]).contains("MAJOR.MINOR"));
        assert!(err(&["--delay=1", "--", "true"]).contains("takes no value"));
        assert!(err(&["--gpus", "2", "--", "true"]).contains("unknown flag `--gpus`"));
        assert!(err(&["cargo", "test"]).contains("after `--`"));
        assert!(err(&["--devices", "2"]).contains("no command"));
        assert!(err(&["--"]).contains("nothing to run"));
    }

    #[test]
    fn machine_only_parsing_refuses_a_command() {
        let got = parse_machine(&strings(&["--devices=2", "--cc=9.0"])).unwrap();
        assert_eq!(
            (got.devices, got.compute_capability, got.command.len()),
            (Some(2), Some((9, 0)), 0)
        );
        assert_eq!(parse_machine(&[]).unwrap(), EmuOptions::default());
        assert!(parse_machine(&strings(&["--", "ls"]))
            .unwrap_err()
            .contains("chooses its own"));
    }
}
