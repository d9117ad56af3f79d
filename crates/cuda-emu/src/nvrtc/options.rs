//! NVRTC's option list, parsed the way NVRTC reads it, into what the host compiler needs.
//!
//! Invariants: every option NVRTC documents that changes nothing on a CPU (code generation,
//! register limits, line info, fast-math flags whose host equivalent would change results) is
//! accepted and recorded; every option that changes the program (macros, include folders,
//! pre-included headers, the language standard, the architecture's `__CUDA_ARCH__`) is honoured;
//! anything else is refused, with a log line naming it, as NVRTC refuses it.

/// The options of one compile, as the host compiler takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOptions {
    /// `-std=` value for g++ (`c++17` unless `--std` says otherwise).
    pub std: String,
    /// `__CUDA_ARCH__` (e.g. 900 for `compute_90`).
    pub cuda_arch: u32,
    /// `-D`/`-U` arguments in the order given (each already prefixed, e.g. `-DN=4`).
    pub macros: Vec<String>,
    /// Include folders in the order given.
    pub include_paths: Vec<String>,
    /// Headers to pre-include, in the order given.
    pub pre_includes: Vec<String>,
}

/// An option NVRTC would refuse: the log line to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError(pub String);

const SUPPORTED_ARCHS: [u32; 11] = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121];

/// The virtual or real architectures this NVRTC accepts (`compute_XX` / `sm_XX`), as numbers.
pub fn supported_archs() -> &'static [u32] {
    &SUPPORTED_ARCHS
}

fn arch(value: &str) -> Result<u32, OptionError> {
    let digits = value
        .strip_prefix("compute_")
        .or_else(|| value.strip_prefix("sm_"))
        .map(|d| d.trim_end_matches(['a', 'f']));
    match digits.and_then(|d| d.parse::<u32>().ok()) {
        Some(n) if SUPPORTED_ARCHS.contains(&n) => Ok(n * 10),
        _ => Err(OptionError(format!(
            "nvrtc: error: invalid value for --gpu-architecture (-arch): {value}"
        ))),
    }
}

fn boolean(name: &str, value: &str) -> Result<(), OptionError> {
    match value {
        "true" | "false" => Ok(()),
        _ => Err(OptionError(format!(
            "nvrtc: error: invalid value for {name}: {value} (expected true or false)"
        ))),
    }
}

/// Options that take no value and change nothing on the host.
const ACCEPTED_FLAGS: [&str; 22] = [
    "--device-as-default-execution-space",
    "-default-device",
    "-lineinfo",
    "--generate-line-info",
    "-G",
    "--device-debug",
    "--use_fast_math",
    "-use_fast_math",
    "--restrict",
    "-restrict",
    "--extra-device-vectorization",
    "-extra-device-vectorization",
    "-w",
    "--disable-warnings",
    "--no-source-include",
    "-no-source-include",
    "-dopt=on",
    "--dopt=on",
    "-rdc=false",
    "--relocatable-device-code=false",
    "--device-int128",
    "-device-int128",
];

/// Options of the form `NAME=true|false` that change nothing on the host.
const ACCEPTED_BOOLEANS: [&str; 8] = [
    "--ftz",
    "-ftz",
    "--prec-sqrt",
    "-prec-sqrt",
    "--prec-div",
    "-prec-div",
    "--fmad",
    "-fmad",
];

/// Options of the form `NAME=<number>` that change nothing on the host.
const ACCEPTED_NUMBERS: [&str; 2] = ["--maxrregcount", "-maxrregcount"];

/// Parses NVRTC's option list. Options may be given as `--name=value` or as `-x value` pairs
/// (`-I dir`, `-D def`, `-arch compute_90`); `-Idir` / `-Ddef` also work, as in NVRTC.
pub fn parse(options: &[String]) -> Result<HostOptions, OptionError> {
    let mut out = HostOptions {
        std: "c++17".into(),
        cuda_arch: 750,
        macros: Vec::new(),
        include_paths: Vec::new(),
        pre_includes: Vec::new(),
    };
    let mut i = 0;
    while i < options.len() {
        let opt = options[i].as_str();
        // The value of a two-word option (`-I dir`), consuming the next entry.
        let mut next = |name: &str| -> Result<String, OptionError> {
            i += 1;
            options
                .get(i)
                .cloned()
                .ok_or_else(|| OptionError(format!("nvrtc: error: option {name} needs a value")))
        };
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) if n.starts_with("--") || !matches!(n, "-D" | "-I" | "-U") => {
                (n, Some(v.to_string()))
            }
            _ => (opt, None),
        };
        match name {
            "--gpu-architecture" | "-arch" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                out.cuda_arch = arch(&v)?;
            }
            "--std" | "-std" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                match v.as_str() {
                    "c++03" | "c++11" | "c++14" | "c++17" | "c++20" => out.std = v,
                    _ => {
                        return Err(OptionError(format!(
                            "nvrtc: error: invalid value for --std: {v}"
                        )))
                    }
                }
            }
            "--include-path" | "-I" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                out.include_paths.push(v);
            }
            "--define-macro" | "-D" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                out.macros.push(format!("-D{v}"));
            }
            "--undefine-macro" | "-U" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                out.macros.push(format!("-U{v}"));
            }
            "--pre-include" | "-include" => {
                let v = match value {
                    Some(v) => v,
                    None => next(name)?,
                };
                out.pre_includes.push(v);
            }
            n if value.is_some() && ACCEPTED_BOOLEANS.contains(&n) => {
                boolean(n, value.as_deref().unwrap_or_default())?
            }
            n if value.is_some() && ACCEPTED_NUMBERS.contains(&n) => {
                if value.as_deref().unwrap_or_default().parse::<u32>().is_err() {
                    return Err(OptionError(format!(
                        "nvrtc: error: invalid value for {n}: {}",
                        value.unwrap_or_default()
                    )));
                }
            }
            _ if ACCEPTED_FLAGS.contains(&opt) => {}
            _ => {
                if let Some(rest) = opt.strip_prefix("-I").filter(|r| !r.is_empty()) {
                    out.include_paths.push(rest.to_string());
                } else if let Some(rest) = opt.strip_prefix("-D").filter(|r| !r.is_empty()) {
                    out.macros.push(format!("-D{rest}"));
                } else if let Some(rest) = opt.strip_prefix("-U").filter(|r| !r.is_empty()) {
                    out.macros.push(format!("-U{rest}"));
                } else {
                    return Err(OptionError(format!(
                        "nvrtc: error: unrecognized option {opt}"
                    )));
                }
            }
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kilns_options_are_accepted_and_honoured() {
        let parsed = parse(&strings(&[
            "--gpu-architecture=compute_90",
            "--std=c++17",
            "--device-as-default-execution-space",
            "-lineinfo",
            "--include-path=/x/include",
            "-I",
            "/y",
            "-DN=4",
            "--define-macro=M",
            "--fmad=false",
            "--maxrregcount=64",
        ]))
        .unwrap();
        assert_eq!(parsed.cuda_arch, 900);
        assert_eq!(parsed.std, "c++17");
        assert_eq!(parsed.include_paths, ["/x/include", "/y"]);
        assert_eq!(parsed.macros, ["-DN=4", "-DM"]);
        assert_eq!(parse(&strings(&["-arch", "sm_80"])).unwrap().cuda_arch, 800);
    }

    #[test]
    fn unknown_options_and_bad_values_are_refused_naming_them() {
        let err = parse(&strings(&["--frobnicate"])).unwrap_err();
        assert!(err.0.contains("--frobnicate"), "{}", err.0);
        assert!(parse(&strings(&["--gpu-architecture=compute_42"])).is_err());
        assert!(parse(&strings(&["--std=c++99"])).is_err());
        assert!(parse(&strings(&["--ftz=maybe"])).is_err());
        assert!(parse(&strings(&["-I"])).is_err());
    }
}
