// Logging setup: level by name and a per-process role tag. Used by apps and tests.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace lh {

Status set_log_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    return invalid_argument("log level '" + level + "' is not one of trace, debug, info, warn, error, off");
  spdlog::set_level(lvl);
  return Status::Ok();
}

void set_log_role(const std::string& role) {
  // Replacing the default logger races with threads logging through it: only do it when the role changes (a worker
  // that joins the job's next epoch names itself again with the same rank).
  if (spdlog::default_logger_raw() && spdlog::default_logger_raw()->name() == "longhaul[" + role + "]") return;
  spdlog::drop("longhaul[" + role + "]");
  auto logger = spdlog::stderr_color_mt("longhaul[" + role + "]");
  logger->set_pattern("%H:%M:%S.%e %^%l%$ [" + role + "] %v");
  logger->set_level(spdlog::get_level());
  spdlog::set_default_logger(logger);
}

}  // namespace lh
