//! The `hookline` binary: parses the command line and hands over to the library.

// mimalloc: glibc malloc/free was ~23% of CPU under load (many small per-record allocations).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    hookline::cli::main()
}
