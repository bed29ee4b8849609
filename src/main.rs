use clap::Parser;

fn main() -> std::process::ExitCode {
    vgate::logging::init();
    vgate::cli::main(vgate::cli::Cli::parse())
}
