/* plan.h - what the rest of the engine tells the plans (plan.c, ferry.h's
 * ferry_plan_*): the engine keeps its plans in a list so that an unregister
 * can release the plans holding a removed region, and shutdown can detach
 * them before the peers they point to go. */
#ifndef FERRY_PLAN_H
#define FERRY_PLAN_H

#include "core/engine.h"

/* After regions left the registry (registration.c): every plan of the
 * engine holding one of `removed` fails its later transfers, naming it. */
void ferry_plans_release(ferry_engine *engine, const ferry_region *removed, size_t count);
/* Shutdown, once no call is inside the engine: the plans forget the engine
 * and their peer, so ferry_plan_free works after destroy. */
void ferry_plans_detach(ferry_engine *engine);

#endif
