//! The `agentvfs` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    agentvfs::cli::main()
}
