use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = vgate::cli::Cli::parse();
    vgate::logging::init(cli.log_format);
    vgate::cli::main(cli)
}
