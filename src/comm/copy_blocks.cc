// copy_blocks_host: see copy_blocks.h.
#include "comm/copy_blocks.h"

#include <cstring>

namespace ncf {

void copy_blocks_host(void* dst, const void* src, const CopyBlock* blocks, int64_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < n; ++i)
    if (blocks[i].bytes > 0)
      std::memcpy(d + blocks[i].dst_off, s + blocks[i].src_off, size_t(blocks[i].bytes));
}

}  // namespace ncf
