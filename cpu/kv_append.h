// The CPU backend's KV-cache append: k_new/v_new rows converted into the cache's storage type,
// with the overwritten slots saved first so that a failure after the append (an allocation
// inside the kernel) restores the cache exactly as the caller passed it.
#pragma once

#include <cstdint>

#include "common/alloc.h"
#include "common/backend.h"

namespace ioattn::cpu {

class KvAppender {
 public:
  // Allocates the copy of the slots the append overwrites; nothing is written yet.
  Status prepare(const AttnParams& p, const KvAppend& a, const int32_t* seqlens);
  void apply() { copy_rows(true); }
  void undo() { copy_rows(false); }

 private:
  void copy_rows(bool forward);

  const AttnParams* p_ = nullptr;
  const KvAppend* a_ = nullptr;
  const int32_t* seqlens_ = nullptr;
  ScratchPtr<char> backup_;
};

}  // namespace ioattn::cpu
