// defines: the registry through which each apps/*.cpp adds its CLI subcommands to `longhaul`.
// Used by apps/main.cpp and every command file (train, launch, bench …).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace lh::app {

// A command file registers a function that adds its subcommand(s) to `parent`: the root app, or the
// `bench` group when parent_name is "bench". The function sets the subcommand's callback; a callback
// that fails throws CLI::RuntimeError(exit_code) after printing the error.
struct CommandRegistration {
  std::string parent_name;  // "" for a top-level command, "bench" for a benchmark
  int order;                // position in --help
  std::function<void(CLI::App& parent)> add;
};

std::vector<CommandRegistration>& command_registry();

struct RegisterCommand {
  RegisterCommand(std::string parent, int order, std::function<void(CLI::App&)> add) {
    command_registry().push_back({std::move(parent), order, std::move(add)});
  }
};

// The running binary's real path (from /proc/self/exe), "" when it cannot be read. Re-executing it by
// this path keeps the process name `longhaul`; /proc/self/exe itself would name it `exe`.
std::string self_exe();
// `given` when set, else scripts/wan.sh in the first folder above the binary that has one, else
// "scripts/wan.sh" (relative to the working directory).
std::string find_wan_script(const std::string& given);

// Sets the name `ps -o comm`, `top` and `pgrep` show for this process (at most 15 bytes are kept).
void name_this_process(const std::string& name);

// Prints "longhaul: error: <message>" to stderr and throws CLI::RuntimeError(code).
[[noreturn]] void fail(const std::string& message, int code = 1);
// The exit code of a job that was preempted (SIGTERM) and saved a checkpoint to resume from: EX_TEMPFAIL.
inline constexpr int kPreemptedExitCode = 75;

}  // namespace lh::app
