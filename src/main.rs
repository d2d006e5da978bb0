use std::process::ExitCode;

fn main() -> ExitCode {
    // SAFETY: first statement of main, no other thread exists yet.
    unsafe { benign_attention::runtime::configure_threads() };
    benign_attention::runtime::keep_freed_memory();
    benign_attention::cli::main()
}
