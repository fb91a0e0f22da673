// warmctx - a workspace-context engine for local LLM inference.
#include <cstring>

#include "cli.h"

int main(int argc, char ** argv) {
    using namespace warmctx::cli;
    CLI::App app{
        "warmctx - keeps the KV of a coding agent's stable context warm across turns, and proves warm == cold"};
    app.footer("The benchmarks are a program of their own: warmctx-bench --help.");
    app.set_version_flag("--version", version_line("warmctx"));
    app.require_subcommand(1);
    int rc = 0;  // the exit code of the command that runs
    register_model_commands(app, rc);
    register_context_commands(app, rc);
    register_serve_command(app, rc);
    register_snapshot_commands(app, rc);
    // `warmctx bench ...` was where the benchmarks lived: name where they are now rather
    // than answer "unknown command".
    if (argc > 1 && std::strcmp(argv[1], "bench") == 0) {
        std::string rest;
        for (int i = 2; i < argc; ++i) rest += std::string(" ") + argv[i];
        std::fprintf(
            stderr,
            "error: the benchmarks are a program of their own: run warmctx-bench%s (see warmctx-bench --help)\n",
            rest.c_str());
        return 2;
    }
    return parse_and_run(app, argc, argv, rc);
}
