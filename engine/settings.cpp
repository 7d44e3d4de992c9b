// The environment's part of the process-wide settings (engine/settings.h): the
// settings themselves live beside the resource each governs.
#include "engine/settings.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace towerlab::detail {

void warn_about_environment(const char* variable, std::string_view value, std::string_view why) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> warned;
  std::lock_guard lock(mutex);
  if (!warned.insert(variable).second) return;
  std::fprintf(stderr, "towerlab: %s=%.*s %.*s; the default is used\n", variable, int(value.size()),
               value.data(), int(why.size()), why.data());
}

std::optional<std::string> environment_choice(const char* variable,
                                              std::initializer_list<std::string_view> choices) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  std::string known;
  for (std::string_view choice : choices) {
    if (choice == value) return std::string(value);
    known += (known.empty() ? "" : ", ") + std::string(choice);
  }
  warn_about_environment(variable, value, "is not one of " + known);
  return std::nullopt;
}

}  // namespace towerlab::detail
