use std::process::ExitCode;

fn main() -> ExitCode {
    // SAFETY: first statement of main, no other thread exists yet.
    unsafe { benign_attention::runtime::configure_process() };
    benign_attention::cli::main()
}
