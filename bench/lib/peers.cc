#include "bench/lib/peers.h"
