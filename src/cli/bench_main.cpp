// warmctx-bench - warmctx's benchmarks: reproducible runs with stable JSON output, most of
// them side by side with llama.cpp's llama-server and llama-bench of the same build.
// A program of its own so that the warmctx command carries only what a user runs.
#include "cli.h"

int main(int argc, char ** argv) {
    using namespace warmctx::cli;
    CLI::App app{"warmctx-bench - warmctx's benchmarks, with JSON output (--json); see docs/benchmarks.md"};
    app.set_version_flag("--version", version_line("warmctx-bench"));
    app.require_subcommand(1);
    int rc = 0;  // the exit code of the benchmark that runs
    register_bench_commands(app, rc);
    return parse_and_run(app, argc, argv, rc);
}
