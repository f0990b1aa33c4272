// defines: lh::Status, lh::Result<T>, LH_RETURN_IF_ERROR, LH_ASSIGN_OR_RETURN, LH_ASSERT and the
// check-macro family for foreign error codes (CUDA, cuBLAS, UCX, ZeroMQ). Used by every library.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace lh {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad user input: a flag, a spec, a file
  kCorrupt,          // bad bytes from the network or disk
  kNotFound,
  kUnavailable,  // no device, peer gone, timeout
  kOutOfRange,
  kInternal,
  kIo,
  kAborted,  // the work was abandoned on purpose (a job rolled back to its checkpoint)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: codec spec: unknown token 'int3' (at core/foo.cpp:12)"
  std::string to_string() const;
  // Adds where the error passed through, so a message carries its path up the stack.
  Status& add_context(const char* file, int line);
  Status& prepend(const std::string& what);
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status corrupt(std::string m) {
  return {StatusCode::kCorrupt, std::move(m)};
}
inline Status not_found(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status out_of_range(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
inline Status internal_error(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
inline Status io_error(std::string m) {
  return {StatusCode::kIo, std::move(m)};
}
inline Status aborted(std::string m) {
  return {StatusCode::kAborted, std::move(m)};
}

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status)                          // NOLINT
      : status_(status.ok() ? internal_error("Result constructed from an OK status without a value")
                            : std::move(status)) {}
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

// Foreign error codes: specialise ErrorDomain<Code> with ok(), name() and describe(); then
// check_code() turns any of them into a Status (or a fatal error) the same way.
template <class Code>
struct ErrorDomain;

template <class Code>
Status check_code(Code code, const char* expr, const char* file, int line) {
  using D = ErrorDomain<Code>;
  if (D::ok(code)) return Status::Ok();
  std::string msg = std::string(D::name()) + " call '" + expr + "' failed: " + D::describe(code);
  Status s(D::status_code(code), msg);
  s.add_context(file, line);
  return s;
}

}  // namespace lh

#define LH_CONCAT_INNER(a, b) a##b
#define LH_CONCAT(a, b) LH_CONCAT_INNER(a, b)

#define LH_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::lh::Status lh_status_ = (expr);             \
    if (!lh_status_.ok()) {                       \
      lh_status_.add_context(__FILE__, __LINE__); \
      return lh_status_;                          \
    }                                             \
  } while (0)

#define LH_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) {                               \
    ::lh::Status lh_s_ = tmp.status();           \
    lh_s_.add_context(__FILE__, __LINE__);       \
    return lh_s_;                                \
  }                                              \
  lhs = std::move(tmp).value()

#define LH_ASSIGN_OR_RETURN(lhs, expr) LH_ASSIGN_OR_RETURN_IMPL(LH_CONCAT(lh_result_, __LINE__), lhs, expr)

// Broken invariants in our own code only; never for input from users, files or the network.
#define LH_ASSERT(cond, ...)                                                                          \
  do {                                                                                                \
    if (!(cond)) ::lh::assert_fail(#cond, __FILE__, __LINE__, ::lh::detail::assert_msg(__VA_ARGS__)); \
  } while (0)

// Returns a Status from the enclosing function when a foreign call fails.
#define LH_CHECK_CODE(expr) LH_RETURN_IF_ERROR(::lh::check_code((expr), #expr, __FILE__, __LINE__))
// Aborts with the message when a foreign call fails (for void launchers, like llm.c's cudaCheck).
#define LH_CHECK_CODE_FATAL(expr)                                                     \
  do {                                                                                \
    ::lh::Status lh_s_ = ::lh::check_code((expr), #expr, __FILE__, __LINE__);         \
    if (!lh_s_.ok()) ::lh::assert_fail(#expr, __FILE__, __LINE__, lh_s_.to_string()); \
  } while (0)

namespace lh::detail {
inline std::string assert_msg() {
  return {};
}
inline std::string assert_msg(const std::string& m) {
  return m;
}
inline std::string assert_msg(const char* m) {
  return m;
}
}  // namespace lh::detail
