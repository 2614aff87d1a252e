//! The `seatgate` binary: the command line (`cli/`) over the server library.

mod cli;

/// The allocator of the binary only (a library user picks its own):
/// glibc's malloc and free were about a fifth of the machine's CPU samples
/// under the end-to-end benchmark (docs/performance.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
