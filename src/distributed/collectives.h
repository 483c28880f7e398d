#pragma once

// Internal helpers of d2l::distributed: every failure of a collective
// becomes a c10::Error that names the function, this rank and what was
// being exchanged.

#include <d2l/distributed.h>

#include <exception>
#include <string>

namespace d2l::distributed::detail {

/// The message of `e` without a backtrace.
std::string reason(const std::exception& e);

/// "fn (rank R of N)".
std::string who(const char* fn, const Group& group);

/// Waits for `work`; a failure (a peer gone, a timeout) throws c10::Error
/// naming `fn`, the rank and `what`.
void wait(const c10::intrusive_ptr<c10d::Work>& work, const Group& group, const char* fn,
          const std::string& what);

}  // namespace d2l::distributed::detail
