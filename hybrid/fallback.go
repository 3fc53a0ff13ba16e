package hybrid

import "github.com/hybridrate/hybridrate/local"

// fallbackShare returns the number of nodes LocalFallback divides a limit by: the nodes that can be
// sharing the key now. Redis reports, with each answer for a key, the nodes that used it within the
// last ActiveWindow (10 minutes), departed processes included; the fleet registry counts the limiters
// live now (a heartbeat within its TTL, at least 15 s: FleetSize). A node that shares the key now is
// counted by both, so the smaller of the two is never below the nodes that fall back on the key
// together, and a restarted process stops counting once its heartbeat expires. Before the first
// heartbeat is answered, the key's count stands alone; for a key Redis never answered about, the
// live fleet (or, before it is known, the most nodes Redis reported on any key) is used.
func (l *Limiter) fallbackShare(e *local.Entry) int64 {
	active := l.fleetSize.Load() // 0 until the first heartbeat is answered
	if active < 1 {
		active = l.fleet.Load()
	}
	if e != nil {
		if _, a := e.Global(); a >= 1 && (a < active || l.fleetSize.Load() < 1) {
			active = a
		}
	}
	return max(active, 1)
}
