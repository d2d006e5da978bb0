use std::process::ExitCode;

fn main() -> ExitCode {
    benign_attention::cli::main()
}
