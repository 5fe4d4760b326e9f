// Internal result of every layer below the C ABI: a code from the contract and a message that
// names the argument and value. Nothing below the ABI throws across it or aborts.
#pragma once

#include <string>
#include <utility>

#include "ioattn/ioattn.h"

namespace ioattn {

struct Status {
  ioattn_status code = IOATTN_OK;
  std::string message;

  static Status ok() { return {}; }
  static Status invalid(std::string m) { return {IOATTN_ERROR_INVALID_ARGUMENT, std::move(m)}; }
  static Status unsupported(std::string m) { return {IOATTN_ERROR_UNSUPPORTED, std::move(m)}; }
  static Status out_of_memory(std::string m) { return {IOATTN_ERROR_OUT_OF_MEMORY, std::move(m)}; }
  static Status backend(std::string m) { return {IOATTN_ERROR_BACKEND, std::move(m)}; }
  bool is_ok() const { return code == IOATTN_OK; }
};

}  // namespace ioattn
