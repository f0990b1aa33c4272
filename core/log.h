// defines: longhaul's logging (spdlog underneath) and its level setting. Used by every library and app.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "core/status.h"

namespace lh {
// Sets the global level from "trace|debug|info|warn|error|off"; names the bad value otherwise.
Status set_log_level(const std::string& level);
// Tags every log line with this process's role ("coordinator", "worker 3").
void set_log_role(const std::string& role);
}  // namespace lh

#define LH_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define LH_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define LH_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define LH_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
