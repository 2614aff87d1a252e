//! The `seatgate` binary: everything lives in the library; see `seatgate::cli`.

/// The allocator of the binary only (the library leaves it to its user):
/// glibc's malloc and free were about a fifth of the machine's CPU samples
/// under the end-to-end benchmark (docs/performance.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seatgate::cli::main()
}
