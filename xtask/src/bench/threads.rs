//! The `threads` benchmark group (issue 16): how the CPU training step scales with the thread
//! count, split into its forward, backward and clip + optimizer parts (the clip also alone),
//! next to PyTorch at the same count with `--vs-torch`.
//!
//! The case is the `train` group's ResNet-18 CIFAR step (32x32, batch 32, quick: 4; SGD with
//! momentum, `clip_grad_norm_(1.0)`). kiln's pool is built once per process, so each thread
//! count runs in a child process (this xtask, `bench-threads-child N BATCH STEPS`, with
//! `KILN_NUM_THREADS=N`) that builds the model, takes one warm-up step, times `STEPS` steps
//! part by part and prints one JSON line; PyTorch's side (`threads_cifar_step/N` in
//! `torch_bench.py`) calls `torch.set_num_threads(N)`. Counts: every power of two below the
//! machine's cores, then the cores.
//!
//! Rows per count: the step time, with its three parts and the speed-up over one thread in
//! the reference column (`ratio` = speed-up / threads, the parallel efficiency: 1 is perfect
//! scaling); the forward by op and the backward by node (`kiln_autograd::OpProfile` over the
//! timed steps: the slowest op and node kinds, per step); one row per convolution pass
//! (forward, input gradient, weight gradient): each of the step's convolution shapes timed
//! alone in the child's pool (`bench ops`' `pass_times`), times the number of the model's
//! convolutions of that shape, the shapes listed; and with `--vs-torch` the kiln/PyTorch row of
//! that count. A part, an op, a node, a pass or a shape that stops shrinking as threads are
//! added is where the step stops scaling. Each count also times the `train` group's batch-1
//! eval (ResNet-18 at 224x224 under `no_grad`: a batch smaller than the pool, whose every op
//! must spread one image over the threads), against PyTorch's (`threads_eval/N`) with
//! `--vs-torch`, and the same eval at batch N + 1 (one image past the pool's whole round,
//! `threads_eval_odd/N`).

use super::conv_shapes::RESNET18_CONVS;
use super::harness::{err, kinds_line, kinds_ms, median_of, per_step, ByName, Options, Row};
use super::ops::pass_times;
use super::torch::{Figure, Pairs};
use super::train::{eval_forward, eval_setup, resnet_setup, Resnet};
use kiln_autograd::OpProfile;
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::Layer;
use kiln_optim::Optimizer;
use std::process::Command;
use std::time::Instant;

const GROUP: &str = "threads";
/// The hidden xtask subcommand a child process runs.
pub const CHILD_COMMAND: &str = "bench-threads-child";

/// Forward ops and backward nodes listed by name in a row (the rest are summed as "others").
const TOP_NODES: usize = 5;

/// The three passes of a convolution, in this order.
const PASSES: [&str; 3] = ["forward", "input gradient", "weight gradient"];

/// Medians (ms) of one step's parts at one thread count, the backward's time by node, and
/// each convolution pass of the step's shapes timed alone.
#[derive(Debug, Clone, PartialEq)]
struct Split {
    forward: f64,
    backward: f64,
    /// `clip_grad_norm_`, the optimizer step and `zero_grad` together.
    optimizer: f64,
    /// `clip_grad_norm_` alone (its median; part of `optimizer`).
    clip: f64,
    /// The eval's medians at batch 1 and at batch threads + 1 ([`eval_ms`]; the rows' child
    /// only, 0 in the rounds' children, which time the step alone).
    eval: [f64; 2],
    /// The forward's ops by name (`kiln_autograd::OpProfile`, self time), means over the timed
    /// steps.
    ops: ByName,
    /// The backward's nodes by name, means over the timed steps.
    nodes: ByName,
    /// Per distinct convolution shape of the step: its name, how many of the model's
    /// convolutions have it, and the best ms of each pass alone ([`PASSES`]).
    conv: Vec<(String, usize, [f64; 3])>,
}

impl Split {
    fn total(&self) -> f64 {
        self.forward + self.backward + self.optimizer
    }

    fn to_json(&self, threads: usize) -> String {
        serde_json::json!({
            "threads": threads,
            "forward_ms": self.forward,
            "backward_ms": self.backward,
            "optimizer_ms": self.optimizer,
            "clip_ms": self.clip,
            "eval_ms": self.eval[0],
            "eval_odd_ms": self.eval[1],
            "forward_ops": self.ops,
            "backward_nodes": self.nodes,
            "conv_passes": self.conv,
        })
        .to_string()
    }

    /// ms per step of convolution pass `pass` ([`PASSES`]) over the model's convolutions.
    fn pass_ms(&self, pass: usize) -> f64 {
        self.conv
            .iter()
            .map(|(_, uses, ms)| *uses as f64 * ms[pass])
            .sum()
    }

    /// Pass `pass` shape by shape, one line: `layer4_512to512_3x3_4px 3x 2.10 ms, ...`.
    fn pass_line(&self, pass: usize) -> String {
        let shapes = self.conv.iter();
        let parts: Vec<String> = shapes
            .map(|(name, uses, ms)| format!("{name} {uses}x {:.2} ms", ms[pass]))
            .collect();
        parts.join(", ")
    }

    /// The split from a child's output: its last line that is a JSON object.
    fn from_output(stdout: &str) -> Result<Split, String> {
        let (line, v) = last_json(stdout)?;
        let part = |key: &str| figure(&v, line, key);
        let by_name = |key: &str| -> Result<ByName, String> {
            v[key]
                .as_array()
                .ok_or_else(|| format!("no `{key}` in {line}"))?
                .iter()
                .map(|n| match (n[0].as_str(), n[1].as_f64(), n[2].as_f64()) {
                    (Some(name), Some(calls), Some(ms)) => Ok((name.to_string(), calls, ms)),
                    _ => Err(format!("an entry of `{key}` is not [name, calls, ms]: {n}")),
                })
                .collect()
        };
        let ms = |v: &serde_json::Value| v.as_f64().filter(|x| x.is_finite() && *x >= 0.0);
        let conv = v["conv_passes"]
            .as_array()
            .ok_or_else(|| format!("no `conv_passes` in {line}"))?
            .iter()
            .map(|c| {
                let uses = c[1].as_u64().and_then(|u| usize::try_from(u).ok());
                match (
                    c[0].as_str(),
                    uses,
                    ms(&c[2][0]),
                    ms(&c[2][1]),
                    ms(&c[2][2]),
                ) {
                    (Some(name), Some(uses), Some(f), Some(i), Some(w)) => {
                        Ok((name.to_string(), uses, [f, i, w]))
                    }
                    _ => Err(format!(
                        "a convolution is not [name, uses, [ms, ms, ms]]: {c}"
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Split {
            forward: part("forward_ms")?,
            backward: part("backward_ms")?,
            optimizer: part("optimizer_ms")?,
            clip: part("clip_ms")?,
            eval: [part("eval_ms")?, part("eval_odd_ms")?],
            ops: by_name("forward_ops")?,
            nodes: by_name("backward_nodes")?,
            conv,
        })
    }
}

/// A child's last output line that is a JSON object, parsed.
fn last_json(stdout: &str) -> Result<(&str, serde_json::Value), String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("no figures in the child's output: {stdout:?}"))?;
    let v = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
    Ok((line, v))
}

/// Figure `key` of a child's JSON `line`: a finite time, not negative.
fn figure(v: &serde_json::Value, line: &str, key: &str) -> Result<f64, String> {
    v[key]
        .as_f64()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("no `{key}` in {line}"))
}

/// The thread counts measured on a machine of `cores` cores: the powers of two below it, then
/// `cores` itself.
fn thread_counts(cores: usize) -> Vec<usize> {
    let cores = cores.max(1);
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < cores)
        .collect();
    counts.push(cores);
    counts
}

/// Runs every case of the group (CPU only).
pub fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        return Ok(Vec::new());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (batch, steps) = if options.quick { (4, 1) } else { (32, 5) };
    let mut rows = Vec::new();
    let mut pairs = Pairs::new(GROUP, options);
    let mut one_thread: Option<Split> = None;
    for threads in thread_counts(cores) {
        let split = child(threads, batch, steps, Passes::Timed)?;
        let first = one_thread.get_or_insert_with(|| split.clone());
        let ms = split.total();
        let speedup = first.total() / ms;
        let parts = format!(
            "forward {:.1} / backward {:.1} / clip + step {:.1} ms (the clip {:.1})",
            split.forward, split.backward, split.optimizer, split.clip
        );
        eprintln!("bench threads: {threads} thread(s): {parts}");
        let case = format!("resnet18 32x32 batch {batch} step on {threads} thread(s)");
        rows.push(Row::new(
            GROUP,
            &case,
            "ms",
            ms,
            format!("{parts}; speed-up over 1 thread {speedup:.2} (ratio = speed-up / threads)"),
            speedup / threads as f64,
        ));
        for (what, list, part) in [
            ("forward by op", &split.ops, split.forward),
            ("backward by node", &split.nodes, split.backward),
        ] {
            // The rest of the forward is what no op times (views, layers' glue); of the
            // backward, the engine's bookkeeping.
            let (line, ms) = (kinds_line(list, TOP_NODES), kinds_ms(list));
            eprintln!("bench threads: {what}: {line}");
            rows.push(Row::new(
                GROUP,
                format!("{case}: {what}"),
                "ms",
                ms,
                format!("{line}; ratio = share of the part ({part:.1} ms) listed"),
                ms / part.max(f64::MIN_POSITIVE),
            ));
        }
        for (pass, name) in PASSES.iter().enumerate() {
            let ms = split.pass_ms(pass);
            let speedup = first.pass_ms(pass) / ms.max(f64::MIN_POSITIVE);
            rows.push(Row::new(
                GROUP,
                format!("{case}: convolution {name}, each shape alone"),
                "ms",
                ms,
                format!(
                    "{}; ms per step = each shape's ms times its uses; small-plane weight \
                     gradient: {} (KILN_CONV_WEIGHT_GRAD); ratio = speed-up over 1 thread / \
                     threads",
                    split.pass_line(pass),
                    weight_grad_name()
                ),
                speedup / threads as f64,
            ));
        }
        let id = format!("threads_cifar_step/{threads}");
        pairs.add(&format!("{case} ({id})"), &id, Figure::Millis, ms, || {
            Ok(child(threads, batch, steps, Passes::Skipped)?.total())
        })?;
        for (i, (batch, id)) in [(1, "threads_eval"), (threads + 1, "threads_eval_odd")]
            .into_iter()
            .enumerate()
        {
            let eval = format!("resnet18 224x224 batch {batch} eval on {threads} thread(s)");
            // Per image: one thread ran batch 1 and batch 2.
            let per_image = |ms: f64, images: usize| ms / images as f64;
            let speedup = per_image(first.eval[i], 1 + i)
                / per_image(split.eval[i], batch).max(f64::MIN_POSITIVE);
            rows.push(Row::new(
                GROUP,
                &eval,
                "ms",
                split.eval[i],
                format!(
                    "no_grad forward, median; per-image speed-up over 1 thread {speedup:.2} \
                     (ratio = speed-up / threads)"
                ),
                speedup / threads as f64,
            ));
            let id = format!("{id}/{threads}");
            let ms = split.eval[i];
            let round = || eval_child(threads, batch, steps);
            pairs.add(&format!("{eval} ({id})"), &id, Figure::Millis, ms, round)?;
        }
    }
    rows.extend(pairs.into_rows());
    Ok(rows)
}

/// What a child times besides the step: each convolution pass alone and the evals at batch 1
/// and threads + 1 too (the rows' child), nothing more (the rounds against PyTorch only need
/// the step), or only the eval at its BATCH, without the step (the evals' rounds).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Passes {
    Timed,
    Skipped,
    EvalOnly,
}

/// The child's optional fourth argument that skips the passes.
const NO_PASSES: &str = "--no-passes";
/// The child's optional fourth argument that times the eval at BATCH alone.
const EVAL_ONLY: &str = "--eval-only";

/// Runs the step at `threads` threads in a child process and reads its split.
fn child(threads: usize, batch: usize, steps: usize, passes: Passes) -> Result<Split, String> {
    Split::from_output(&child_output(threads, [batch, steps], passes)?)
}

/// Times the eval at `batch` alone at `threads` threads in a child process: its median ms.
fn eval_child(threads: usize, batch: usize, steps: usize) -> Result<f64, String> {
    let stdout = child_output(threads, [batch, steps], Passes::EvalOnly)?;
    let (line, v) = last_json(&stdout)?;
    figure(&v, line, "eval_ms")
}

/// A child's standard output, or what went wrong.
fn child_output(
    threads: usize,
    [batch, steps]: [usize; 2],
    passes: Passes,
) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the xtask binary: {e}"))?;
    let flag = match passes {
        Passes::Timed => None,
        Passes::Skipped => Some(NO_PASSES),
        Passes::EvalOnly => Some(EVAL_ONLY),
    };
    let out = Command::new(exe)
        .arg(CHILD_COMMAND)
        .args([threads, batch, steps].map(|n| n.to_string()))
        .args(flag)
        .env("KILN_NUM_THREADS", threads.to_string())
        .output()
        .map_err(|e| format!("{CHILD_COMMAND}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{CHILD_COMMAND} {threads} failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout.into_owned())
}

/// ResNet-18's eval at 224x224 under `no_grad` at `batch` (the `train` group's case, the same
/// model and forward) in this process's pool: median ms of `runs` forwards after one warm-up.
fn eval_ms(batch: usize, runs: usize) -> Result<f64, String> {
    let (model, x) = eval_setup(batch)?;
    Ok(median_of(runs, || eval_forward(&model, &x))? * 1e3)
}

/// `xtask bench-threads-child THREADS BATCH STEPS [--no-passes | --eval-only]`: the child's
/// side (see the module doc).
pub fn child_entry(args: &[String]) -> Result<(), String> {
    let number = |i: usize, what: &str| -> Result<usize, String> {
        let raw = args.get(i).ok_or_else(|| format!("missing {what}"))?;
        raw.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{what} must be a positive integer, not {raw:?}"))
    };
    let (threads, batch, steps) = (
        number(0, "THREADS")?,
        number(1, "BATCH")?,
        number(2, "STEPS")?,
    );
    let passes = match args.get(3).map(String::as_str) {
        None => Passes::Timed,
        Some(NO_PASSES) => Passes::Skipped,
        Some(EVAL_ONLY) => Passes::EvalOnly,
        Some(other) => {
            return Err(format!(
                "unknown argument {other:?}; expected {NO_PASSES} or {EVAL_ONLY}"
            ))
        }
    };
    let pool = kiln_device::threads::num_threads();
    if pool != threads {
        return Err(format!(
            "asked for {threads} threads, kiln's pool has {pool}: run through `cargo xtask \
             bench threads`, which sets KILN_NUM_THREADS"
        ));
    }
    kiln_autograd::manual_seed(0);
    let eval_runs = (2 * steps).max(3);
    if passes == Passes::EvalOnly {
        let ms = eval_ms(batch, eval_runs)?;
        eprintln!("threads {threads}: batch-{batch} eval {ms:.2} ms");
        println!(
            "{}",
            serde_json::json!({ "threads": threads, "eval_ms": ms })
        );
        return Ok(());
    }
    let (model, params, mut opt, x, y) = resnet_setup(Resnet { size: 32, batch })?;
    let ce = CrossEntropyOptions::default();
    let mut parts = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut profile = None;
    for step in 0..=steps {
        if step == 1 {
            // After the warm-up step: the timed steps' ops and nodes.
            profile = Some(OpProfile::start().map_err(err)?);
        }
        let start = Instant::now();
        let loss = cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)?;
        let forward = start.elapsed();
        loss.backward().map_err(err)?;
        let backward = start.elapsed();
        kiln_optim::clip_grad_norm_(&params, 1.0, 2.0, false).map_err(err)?;
        let clipped = start.elapsed();
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)?;
        if step > 0 {
            // Step 0 is the warm-up.
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            parts[0].push(ms(forward));
            parts[1].push(ms(backward - forward));
            parts[2].push(ms(start.elapsed() - backward));
            parts[3].push(ms(clipped - backward));
        }
    }
    let [forward, backward, optimizer, clip] = parts.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    let times = profile.map(OpProfile::finish).unwrap_or_default();
    let split = Split {
        forward,
        backward,
        optimizer,
        clip,
        ops: per_step(times.forward, steps),
        nodes: per_step(times.backward, steps),
        conv: match passes {
            Passes::Timed => conv_passes(batch, steps.min(3))?,
            Passes::Skipped | Passes::EvalOnly => Vec::new(),
        },
        eval: match passes {
            Passes::Timed => [eval_ms(1, eval_runs)?, eval_ms(threads + 1, eval_runs)?],
            Passes::Skipped | Passes::EvalOnly => [0.0; 2],
        },
    };
    // One readable line for scripts (run.sh compares the small-plane weight gradients by it).
    let passes_part = match passes {
        Passes::Timed => format!(
            "; convolution passes alone: {:.1} / {:.1} / {:.1} ms",
            split.pass_ms(0),
            split.pass_ms(1),
            split.pass_ms(2)
        ),
        Passes::Skipped | Passes::EvalOnly => String::new(),
    };
    eprintln!(
        "threads {threads} (small-plane weight gradient: {}): forward {:.1} / backward {:.1} / \
         clip + step {:.1} ms{passes_part}",
        weight_grad_name(),
        split.forward,
        split.backward,
        split.optimizer,
    );
    println!("{}", split.to_json(threads));
    Ok(())
}

/// The small-plane weight gradient this process runs (`KILN_CONV_WEIGHT_GRAD`).
fn weight_grad_name() -> &'static str {
    kiln_device::ops::conv::weight_grad_path().name()
}

/// Each pass of each of the step's convolution shapes alone (`bench ops`' `pass_times`, best
/// of `reps`), in this process's pool: which pass and shape stop scaling with the threads.
fn conv_passes(batch: usize, reps: usize) -> Result<Vec<(String, usize, [f64; 3])>, String> {
    let values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (i * 7919 % 1000) as f32 * 1e-3 - 0.5)
            .collect()
    };
    let len = |shape: [usize; 4]| shape.iter().product::<usize>();
    RESNET18_CONVS
        .iter()
        .map(|c| {
            let (g, _) = c.geometry(batch)?;
            let x = values(len(g.input_shape()));
            let w = values(len(g.weight_shape()));
            let grad = values(len(g.output_shape()));
            let ms = pass_times(&g, [&x, &w, &grad], reps)?;
            Ok((c.name.to_string(), c.uses, ms))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_the_powers_of_two_below_the_cores_then_the_cores() {
        assert_eq!(thread_counts(1), [1]);
        assert_eq!(thread_counts(2), [1, 2]);
        assert_eq!(thread_counts(12), [1, 2, 4, 8, 12]);
        assert_eq!(thread_counts(16), [1, 2, 4, 8, 16]);
        assert_eq!(thread_counts(0), [1]);
    }

    #[test]
    fn a_childs_split_is_read_from_its_last_json_line() {
        let nodes = (0..7)
            .map(|i| (format!("Node{i}"), 2.0, 7.0 - i as f64))
            .collect();
        let ops = vec![("Convolution".to_string(), 20.0, 1.25)];
        let conv = vec![
            ("wide".to_string(), 4, [1.0, 2.0, 3.0]),
            ("deep".to_string(), 3, [0.5, 0.25, 2.5]),
        ];
        let split = Split {
            forward: 1.5,
            backward: 30.0,
            optimizer: 0.5,
            clip: 0.25,
            eval: [12.5, 40.0],
            ops,
            nodes,
            conv,
        };
        let out = format!("kiln: a warning\n{}\n", split.to_json(4));
        assert_eq!(Split::from_output(&out), Ok(split.clone()));
        assert_eq!(split.total(), 32.0);
        // The five slowest by name, the last two (2 + 1 ms) as the rest.
        assert_eq!(kinds_ms(&split.nodes), 28.0);
        assert_eq!(kinds_ms(&split.ops), 1.25);
        assert_eq!(
            kinds_line(&split.ops, TOP_NODES),
            "Convolution 1.2 ms (20x)"
        );
        let line = kinds_line(&split.nodes, TOP_NODES);
        assert!(
            line.starts_with("Node0 7.0 ms (2x), Node1 6.0 ms (2x)"),
            "{line}"
        );
        assert!(line.ends_with("Node4 3.0 ms (2x), others 3.0 ms"), "{line}");
        // Each pass over the model: every shape's ms times its uses.
        assert_eq!(
            [0, 1, 2].map(|p| split.pass_ms(p)),
            [4.0 + 1.5, 8.0 + 0.75, 12.0 + 7.5]
        );
        assert_eq!(split.pass_line(2), "wide 4x 3.00 ms, deep 3x 2.50 ms");
        assert!(Split::from_output("no figures\n")
            .unwrap_err()
            .contains("no figures"));
        let negative = r#"{"forward_ms": -1, "backward_ms": 1, "optimizer_ms": 1, "clip_ms": 1,
            "forward_ops": [], "backward_nodes": []}"#;
        assert!(Split::from_output(negative)
            .unwrap_err()
            .contains("forward_ms"));
        let json = split.to_json(4);
        let bad_pass = json.replace("[0.5,0.25,2.5]", "[0.5,-1.0,2.5]");
        assert_ne!(bad_pass, json, "{json}");
        let e = Split::from_output(&bad_pass).unwrap_err();
        assert!(e.contains("a convolution is not"), "{e}");
        let bad_op = json.replace(r#"["Convolution",20.0,1.25]"#, r#"["Convolution",20.0]"#);
        assert_ne!(bad_op, json, "{json}");
        let e = Split::from_output(&bad_op).unwrap_err();
        assert!(e.contains("an entry of `forward_ops`"), "{e}");
    }
}
