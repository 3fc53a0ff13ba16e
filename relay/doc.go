// Package relay serves the leases of many hybrid limiters from one process, so that Redis sees the
// relays instead of every process: the relay tier of a large fleet (docs/design.md, "Any fleet size").
//
// A [Relay] is one node of each key's bucket in Redis (reconcile.lua's protocol, through a
// *central.Client with the relay's own node id). It holds what Redis leases it in a pool per key and
// hands it on to its children — the limiters of its host or zone, created with hybrid.WithUpstream —
// over the same protocol: a child's reconcile and its synchronous takes are answered from the pool,
// in memory, and the relay reports the pool's consumption and its children's demand to Redis in its
// own background rounds ([Relay.Tick], [Relay.Run]). A child's decision that needs tokens now and
// finds the pool empty makes the relay ask Redis at once, for that key only.
//
// What a child is lent is at most its demand-weighted share of the key's burst, computed with the
// key's demand over the whole fleet as Redis reports it; what the relay holds for its children is at
// most their summed share, as reconcile.lua caps it. So the shares of the children of all relays add
// up to what Redis lends, as if each child were a node of the bucket, while Redis runs one script
// call per key per relay round instead of one per node. docs/accuracy.md states what the pool adds
// to the overshoot bound.
//
// What a relay does not do: it keeps no state across restarts (a new relay is a new node of every
// bucket; what its children held is written off as a node's lease is), it does not check bans (the
// children read the ban list from Redis as before), and a child's failure policy applies when the
// relay cannot answer (its error reaches the child as Redis's would).
package relay
