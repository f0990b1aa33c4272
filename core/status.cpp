// Status formatting and the assert handler. Used by everything that returns lh::Status.
#include "core/status.h"

#include <cstring>

namespace lh {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kCorrupt:
      return "Corrupt";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kIo:
      return "Io";
    case StatusCode::kAborted:
      return "Aborted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status& Status::add_context(const char* file, int line) {
  if (ok()) return *this;
  const char* base = std::strrchr(file, '/');
  // Keep "folder/file.cpp" so the path is short but unambiguous.
  if (base && base != file) {
    const char* p = base - 1;
    while (p > file && *p != '/') --p;
    base = (*p == '/') ? p + 1 : p;
  } else {
    base = file;
  }
  message_ += " [" + std::string(base) + ":" + std::to_string(line) + "]";
  return *this;
}

Status& Status::prepend(const std::string& what) {
  if (!ok()) message_ = what + ": " + message_;
  return *this;
}

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "longhaul: internal error: %s failed at %s:%d%s%s\n", expr, file, line, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace lh
