package hybrid

import "github.com/hybridrate/hybridrate/central"

// InternalKey returns the Redis key "<prefix>:v3:x:<name>", in the limiter's own namespace: no key
// passed to AllowN (nor any key of the strict algorithms or of package concurrency) can ever name
// it. It is for tools that keep their records next to the limiter's, such as package observe's
// fleet reports ("{dashboard}"); the names "{bans}", "bans" and "{fleet}" are the limiter's.
func InternalKey(prefix, name string) string { return central.InternalKey(prefix, name) }
