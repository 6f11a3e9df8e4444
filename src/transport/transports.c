/* transports.c - the transports built into this library, best first. A
 * peer's data goes over the first one that both sides offer and that can
 * reach it; the later usable ones stand by (core/rail_choice.h). */
#include "core/transport.h"
#include "transport/shm.h"

/* shm before fabric: on one host a CMA copy beats any NIC's loopback. */
const ferry_transport *const ferry_transports[] = {&ferry_transport_shm, &ferry_transport_fabric,
                                                   &ferry_transport_tcp, NULL};
