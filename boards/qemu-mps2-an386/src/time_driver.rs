//! embassy-time driver on the Cortex-M SysTick (core clock 25 MHz on the MPS2 AN386).
//!
//! The 64-bit clock is `systick_timer::Timer` (SysTick wrap counting with a race-free read).
//! Alarms are ours: embassy's integrated timer queue (`embassy-time-queue-utils`, which keeps
//! the queue links inside each executor task, so no fixed slot count and no heap), checked on
//! every SysTick interrupt. SysTick wraps every millisecond, so alarms fire with up to 1 ms of
//! lateness; `now()` has microsecond resolution.

use core::cell::RefCell;

use critical_section::Mutex;
use embassy_time_driver::Driver;
use embassy_time_queue_utils::Queue;

/// Core clock feeding SysTick (hw/arm/mps2.c: SYSCLK_FRQ).
const CORE_HZ: u64 = 25_000_000;
/// SysTick reload for a 1 ms period.
const RELOAD: u32 = (CORE_HZ / 1_000) as u32 - 1;

struct Alarms {
    queue: Queue,
    /// Earliest expiry in the queue, in ticks (`u64::MAX` when empty).
    next: u64,
}

/// The driver: clock plus alarm queue.
pub struct SysTickDriver {
    clock: systick_timer::Timer,
    alarms: Mutex<RefCell<Alarms>>,
}

embassy_time_driver::time_driver_impl!(static DRIVER: SysTickDriver = SysTickDriver {
    clock: systick_timer::Timer::new(embassy_time_driver::TICK_HZ, RELOAD, CORE_HZ),
    alarms: Mutex::new(RefCell::new(Alarms { queue: Queue::new(), next: u64::MAX })),
});

impl Driver for SysTickDriver {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn schedule_wake(&self, at: u64, waker: &core::task::Waker) {
        critical_section::with(|cs| {
            let mut alarms = self.alarms.borrow_ref_mut(cs);
            if alarms.queue.schedule_wake(at, waker) {
                // Wakes anything already due and returns the new earliest expiry.
                let now = self.clock.now();
                alarms.next = alarms.queue.next_expiration(now);
            }
        });
    }
}

/// Starts SysTick; call once, before awaiting any timer.
pub fn start(syst: &mut cortex_m::peripheral::SYST) {
    DRIVER.clock.start(syst);
}

#[cortex_m_rt::exception]
fn SysTick() {
    DRIVER.clock.systick_handler();
    let now = DRIVER.clock.now();
    critical_section::with(|cs| {
        let mut alarms = DRIVER.alarms.borrow_ref_mut(cs);
        if now >= alarms.next {
            alarms.next = alarms.queue.next_expiration(now);
        }
    });
}
