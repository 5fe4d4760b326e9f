// Peers and ceilings measured in the same run as the kernels (owned by the CPU kernel work).
#pragma once
