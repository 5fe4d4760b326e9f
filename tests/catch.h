// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04, the GPU machine) spell their header differently.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
