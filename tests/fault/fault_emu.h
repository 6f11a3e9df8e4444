/* fault_emu.h - a userspace link emulator between two TUN devices: what tc
 * netem does (delay, loss, reordering), for kernels built without netem. */
#ifndef FERRY_FAULT_EMU_H
#define FERRY_FAULT_EMU_H

#include <stdint.h>

typedef struct fault_emu fault_emu;

/* Forwards IP packets between two non-blocking TUN fds (owned from now on)
 * in a thread of its own; a clean link until fault_emu_set. */
fault_emu *fault_emu_start(int fd_a, int fd_b);
/* Per direction: every packet is delayed delay_ms, dropped with loss_pct
 * percent, or (reorder_pct percent) sent at once, overtaking delayed ones. */
void fault_emu_set(fault_emu *emu, unsigned delay_ms, double loss_pct, double reorder_pct);
void fault_emu_counters(fault_emu *emu, uint64_t *forwarded, uint64_t *dropped);
/* Stops the thread and closes both devices. */
void fault_emu_stop(fault_emu *emu);

#endif
