// The CPU backend's tuning run (cpu/calibrate.cc), behind Backend::calibrate.
#pragma once

#include "common/calibration.h"
#include "common/status.h"

namespace ioattn::cpu {

// Times block sizes (prefill) and the prefetch distance and key splits (decode) around the
// cache-derived plan of the detected host, and fills *out with the winners.
Status calibrate(const TuneRequest& request, Calibration* out);

}  // namespace ioattn::cpu
