//! The `seatgate` binary: everything lives in the library; see `seatgate::cli`.

fn main() -> std::process::ExitCode {
    seatgate::cli::main()
}
