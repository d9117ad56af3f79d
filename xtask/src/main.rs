//! kiln's developer tasks, run as `cargo xtask <command>`.

use std::process::ExitCode;

mod arch;
mod bench;
mod cpu_mutants;
mod cuda_tools;
mod emu;
mod gpu_pack;
mod kernels;
mod memviz;
mod paths;
mod record_traces;
mod replay;
mod trace_check;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  arch       check the layout rules: file length, no import cycles between files, one seam signature
  kernels    compile every .cu file with NVRTC (compute_80/90) and assemble with ptxas (sm_80/90)
  gpu-pack   build test and bench binaries into target/gpu-pack/ for a GPU machine
  replay     replay an allocation trace through the simulated backend (--policy kiln|pytorch)
  record-traces  record the shipped allocation traces from real CPU training runs
             (KILN_NUM_THREADS=1 KILN_CPU_CAPABILITY=avx2 cargo xtask record-traces
             [--only NAME] [--check: fail where a shipped file differs from a new recording])
  bench      run benchmark groups and write target/kiln-bench/report.{json,md}
  memviz     draw kiln's memory picture of a snapshot pickle: cargo xtask memviz SNAPSHOT [-o OUT.svg]
  emu        run a command with the CUDA emulator (kiln-cuda-emu) in place of NVIDIA's libraries:
             cargo xtask emu [--devices N] [--memory BYTES] [--cc X.Y] [--delay] -- CMD...
  emu-suite  every GPU test binary and the CUDA example runs under the emulator, KILN_REQUIRE_CUDA=1
             (--only TEXT to run the matching ones, --list to print their commands)
  emu-mutants  plant known bugs in copies of kiln's kernels and launchers; show the emulator
             catches each (emu-probe CASE [--bug]: the launcher cases it runs)
  cpu-mutants  plant known bugs in copies of size- and view-specific paths (CPU kernels, the
             allocator's free-block index, the .pth reader's zip64 records) and of rules only
             some settings reach (parameter groups, the allocator's boundaries and plans, the
             data loader, backward, DDP and ZeRO, checkpoints, schedulers, losses); show the
             test meant for each fails (--only TEXT, --list)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::FAILURE;
    };
    let result: Result<(), String> = match cmd.as_str() {
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        "arch" => arch::run(rest),
        "kernels" => kernels::run(rest),
        "gpu-pack" => gpu_pack::run(rest),
        "replay" => replay::run(rest),
        "record-traces" => record_traces::run(rest),
        "bench" => bench::run(rest),
        "bench-mpi-rank" => bench::distributed_mpi::rank_entry(rest),
        bench::threads::CHILD_COMMAND => bench::threads::child_entry(rest),
        "memviz" => memviz::run(rest),
        "emu-suite" => emu::suite::run(rest),
        "emu-mutants" => emu::mutants::run(rest),
        "cpu-mutants" => cpu_mutants::run(rest),
        "emu-probe" => {
            return match emu::probe::run(rest) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    eprintln!("xtask: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        "emu" => {
            return match emu::run(rest) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    eprintln!("xtask: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        other => Err(format!("unknown command `{other}`: {rest:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
