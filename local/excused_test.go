package local

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAddExcusedStartsANewIncarnationOnceAnswered: tokens a failure policy admitted are all
// reported as admitted, but the excused ones are left out of the consumption Redis charges until
// an answer gives the node Redis's charge; the next call then starts a new incarnation seeded with
// that charge plus the excused tokens, and reports everything.
func TestAddExcusedStartsANewIncarnationOnceAnswered(t *testing.T) {
	s, e := leased(t, 10, 0, 100)
	require.Equal(t, Taken, e.TryTake(10)) // the lease, spent
	inc := e.Incarnation()

	// The outage: 8 admitted by the fallback, 6 of them excused.
	require.Equal(t, Taken, e.AddExcused(5, 4))
	require.Equal(t, Taken, e.AddExcused(3, 2))
	assert.Equal(t, int64(18), e.Total())
	assert.True(t, e.Pending(), "the charged part is debt to report")

	c := e.Next(2) // fails: Redis is down
	assert.Equal(t, inc, c.Inc)
	assert.Equal(t, int64(12), c.Cum, "the excused tokens are not charged")
	assert.Equal(t, int64(12), c.Used)
	s.Collect(nil) // the round that sends it
	c = e.Next(3)  // answered: Redis had also leased 5 to a call the node gave up on
	assert.Equal(t, inc, c.Inc)
	e.Grant(Answer{Seq: c.Seq, Charged: 17, Active: 1, At: 3, LeaseUntil: 100, SentUsed: c.Used, SentCum: c.Cum})
	assert.Equal(t, int64(17), e.Charged())
	assert.Contains(t, s.Collect(nil), e, "on the dirty list: the next round tells Redis")

	c = e.Next(4)
	assert.Greater(t, c.Inc, inc, "a new incarnation")
	assert.Equal(t, int64(23), c.Acked, "Redis's charge plus the excused tokens")
	assert.Equal(t, int64(18), c.Cum)
	assert.Equal(t, int64(18), c.Used, "every admission is reported")
	assert.Equal(t, int64(12), c.UAcked)
	assert.Equal(t, int64(5), e.Unused(), "the lease of the abandoned call is the node's")

	// Nothing more excused: the incarnation stays.
	require.Equal(t, Taken, e.AddExcused(1, 0))
	assert.Equal(t, c.Inc, e.Next(5).Inc)
}
