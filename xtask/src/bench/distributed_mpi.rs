//! The `distributed` group's scaling row over two MPI processes: this xtask started twice by
//! `mpirun -np 2` (`xtask bench-mpi-rank`), each process one rank with its own CPU pool, as a
//! CPU data-parallel run is deployed. Needs xtask built with `--features mpi` and `mpirun` on
//! the PATH; without either the row is present with no value and says what is missing (a
//! missing transport is not a failed case).
//!
//! Invariants: the ranks time the same DDP step as the threads row (the same MLP, SGD, batch
//! per rank, one warm-up step, the median of the timed steps); rank 0 alone prints its figure,
//! on one line the launching process parses.

use super::harness::Row;

/// The line rank 0 prints before its median step time in seconds.
#[cfg(feature = "mpi")]
const STEP_LINE: &str = "kiln-bench-mpi step_seconds ";

/// The row's metric when it could not be measured for want of MPI (not a failure).
pub const MISSING: &str = "missing";

/// The scaling row of 2 MPI processes of `batch` against one process over `2 * batch`, whose
/// median step took `single` seconds.
pub fn scaling_row(
    group: &str,
    (sizes, batch, steps): (&[usize], usize, usize),
    single: f64,
) -> Row {
    let case = format!(
        "scaling: 2 MPI processes x batch {batch} vs 1 process x batch {}",
        2 * batch
    );
    match measure(sizes, batch, steps) {
        Ok(Ok(step)) => {
            let efficiency = single / step;
            Row::new(
                group,
                case,
                "efficiency",
                efficiency,
                format!(
                    "1 process {:.1} ms/step, DDP over MPI {:.1} ms/step; target 0.9",
                    single * 1e3,
                    step * 1e3
                ),
                efficiency / 0.9,
            )
        }
        Ok(Err(why)) => Row::new(group, case, MISSING, f64::NAN, why, f64::NAN),
        Err(e) => Row::failed(group, case, &e),
    }
}

/// `Ok(Ok(seconds))`: rank 0's median DDP step over MPI; `Ok(Err(why))`: MPI is not there.
#[cfg(not(feature = "mpi"))]
fn measure(_: &[usize], _: usize, _: usize) -> Result<Result<f64, String>, String> {
    Ok(Err(
        "not measured: this xtask has no MPI backend; install Open MPI \
            (apt-get install openmpi-bin libopenmpi-dev libclang-dev) and run \
            `cargo run --release -p xtask --features mpi -- bench distributed`"
            .into(),
    ))
}

#[cfg(feature = "mpi")]
fn measure(sizes: &[usize], batch: usize, steps: usize) -> Result<Result<f64, String>, String> {
    use std::process::Command;
    if Command::new("mpirun").arg("--version").output().is_err() {
        return Ok(Err(
            "not measured: `mpirun` is not on the PATH (apt-get install openmpi-bin)".into(),
        ));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let out = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe"])
        .arg(exe)
        .args([
            "bench-mpi-rank",
            &sizes.join(","),
            &batch.to_string(),
            &steps.to_string(),
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .map_err(|e| format!("mpirun: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(STEP_LINE));
    match (out.status.success(), line.map(str::parse::<f64>)) {
        (true, Some(Ok(seconds))) => Ok(Ok(seconds)),
        _ => Err(format!(
            "mpirun -np 2 xtask bench-mpi-rank failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// `xtask bench-mpi-rank SIZES BATCH STEPS`: one rank of [`scaling_row`]'s measurement.
#[cfg(feature = "mpi")]
pub fn rank_entry(args: &[String]) -> Result<(), String> {
    use super::harness::err;
    use kiln_autograd::{DType, Device, Tensor};
    use kiln_distributed::{DdpOptions, DistributedDataParallel};
    let [sizes, batch, steps] = args else {
        return Err("usage: xtask bench-mpi-rank SIZES BATCH STEPS (started by the bench)".into());
    };
    let parse = |s: &str| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    let sizes: Vec<usize> = sizes.split(',').map(parse).collect::<Result<_, _>>()?;
    let (batch, steps) = (parse(batch)?, parse(steps)?);
    let group = kiln_distributed::init_process_group(Device::Cpu).map_err(err)?;
    let rank = group.rank();
    let model = super::distributed_parts::model(&sizes)?;
    let ddp = DistributedDataParallel::new(model, group, DdpOptions::default()).map_err(err)?;
    let mut opt = super::distributed_parts::sgd(ddp.module())?;
    let x = Tensor::randn(&[batch, sizes[0]], DType::F32, Device::Cpu).map_err(err)?;
    let mut times = Vec::new();
    for i in 0..=steps {
        let start = std::time::Instant::now();
        let out = ddp.forward(&x).map_err(err)?;
        let zeros = out.zeros_like().map_err(err)?;
        let loss =
            kiln_losses::mse_loss(&out, &zeros, kiln_losses::Reduction::Mean).map_err(err)?;
        ddp.backward(&loss).map_err(err)?;
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)?;
        if i > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    if rank == 0 {
        println!("{STEP_LINE}{}", super::distributed_parts::median(times));
    }
    Ok(())
}

/// Without the `mpi` feature there is no rank to run.
#[cfg(not(feature = "mpi"))]
pub fn rank_entry(_: &[String]) -> Result<(), String> {
    Err("this xtask has no MPI backend: build it with `--features mpi`".into())
}

#[cfg(all(test, not(feature = "mpi")))]
mod tests {
    use super::*;

    #[test]
    fn without_mpi_the_scaling_row_is_missing_not_failed_and_says_how_to_build() {
        let row = scaling_row("distributed", (&[4, 2], 2, 1), 0.5);
        assert_eq!(row.metric, MISSING);
        assert_ne!(row.metric, super::super::harness::FAILED);
        assert!(row.value.is_nan() && row.ratio.is_nan());
        assert!(
            row.reference.contains("--features mpi"),
            "{}",
            row.reference
        );
        assert_eq!(
            row.case,
            "scaling: 2 MPI processes x batch 2 vs 1 process x batch 4"
        );
    }
}
