// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04, the GPU machine; scripts/ci_catch2v3.sh in CI) spell
// their header differently, and v3 moved Approx into namespace Catch where v2 also exported it
// globally. The v2 spelling Catch::Approx names the vector matcher instead, so the one spelling
// that works in both is the global Approx, restored here for v3.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
