// `longhaul keygen FILE`: a new job secret (32 random bytes, 64 hex digits), readable by its owner only. Every member
// of a job (coordinator, workers, ctl) is given it with --key-file.
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "transport/job_secret.h"

namespace lh::app {
namespace {

RegisterCommand reg("", 25, [](CLI::App& app) {
  auto file = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("keygen", "write a new job secret to FILE (mode 0600) for --key-file");
  cmd->add_option("FILE", *file, "where to write it (never overwritten)")->required();
  cmd->callback([file] {
    Status s = JobSecret::generate().save_new(*file);
    if (!s.ok()) fail("keygen: " + s.message(), 2);
    std::printf(
        "wrote a job secret to %s (mode 0600). Give it to the coordinator, each worker and ctl with --key-file %s "
        "(copy it to their machines over a channel you trust, e.g. scp); anyone holding it can join the job.\n",
        file->c_str(), file->c_str());
  });
});

}  // namespace
}  // namespace lh::app
