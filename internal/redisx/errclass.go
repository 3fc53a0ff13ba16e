package redisx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Errors shared by every package that calls Redis through this one. The public packages re-export
// them (hybrid.ErrUnavailable, concurrency.ErrUnavailable, strict.ErrUnavailable and
// central.ErrUnavailable are this same value), so errors.Is works with any name.
var (
	// ErrUnavailable means Redis could not serve the call and nothing decided in its place: the
	// breaker was open (the call was not sent, [ErrBreakerOpen]), or the call failed in transport,
	// timed out or was refused. Returned bare, it means the breaker was open.
	ErrUnavailable = errors.New("hybridrate: redis unavailable")
	// ErrBreakerOpen wraps ErrUnavailable: the breaker is open, the call was not sent.
	ErrBreakerOpen = fmt.Errorf("%w (circuit breaker open)", ErrUnavailable)
	// ErrBadReply means Redis answered with a reply of an unexpected shape.
	ErrBadReply = errors.New("hybridrate: unexpected reply from redis")
)

// classed is a sentinel error that carries its class; see [NewError].
type classed struct {
	msg   string
	class ErrorClass
}

func (e *classed) Error() string { return e.msg }

// NewError returns a sentinel error with the message msg that [Class] sorts into class (and so does
// any error that wraps it). Packages declare their own sentinels with it, named after themselves:
// central.ErrInvalid is NewError(ClassInvalid, "central: invalid request"). Only ClassInvalid and
// ClassBadKey make sense. An error of ClassBadKey whose text shows that the script met a refusal
// (a write that met OOM, an ACL) is ClassRefused instead: a script that catches the error of a call
// reports it as a per-key fault, with the message.
func NewError(class ErrorClass, msg string) error { return &classed{msg: msg, class: class} }

// ErrorClass says what an error from this package (or from go-redis) means for the caller: whether
// Redis is reachable and willing to serve, and so whether the failure policy and the circuit breaker
// should act. See [Class].
type ErrorClass uint8

// The error classes. docs/operations.md has a table of what the limiter does for each.
const (
	// ClassNone is the class of a nil error.
	ClassNone ErrorClass = iota
	// ClassTransport: Redis could not be reached or did not answer in time (dial or I/O errors,
	// timeouts, a closed connection), or the breaker is open (ErrUnavailable). Errors that are not
	// recognised fall here too. The breaker counts it as a failure; the failure policy decides.
	ClassTransport
	// ClassRefused: Redis answered, but refuses to serve this client for now: it is out of memory
	// under noeviction (OOM), a replica (READONLY), busy with a script (BUSY), loading its data
	// (LOADING), cut off from its master or cluster (MASTERDOWN, CLUSTERDOWN, TRYAGAIN), unable to
	// persist (MISCONF), or it rejects our credentials or permissions (NOAUTH, WRONGPASS, NOPERM,
	// an ACL that forbids a command or key a script uses, "max number of clients reached"); also
	// these replies as Redis before 7 wraps them when a script's call meets them. Nothing was applied. The breaker counts it as a failure,
	// as for ClassTransport; the failure policy decides.
	ClassRefused
	// ClassBadKey: Redis is up and served the call, but could not apply it to this key: WRONGTYPE
	// (something else owns the key), a script error, a key the script could not process (a
	// [NewError] of this class, such as central.ErrBadKey), or a reply of an unexpected shape
	// ([ErrBadReply]). It says
	// nothing about Redis's health: the breaker counts it as a success.
	ClassBadKey
	// ClassInvalid: the request was refused before it was sent (a [NewError] of this class, such as
	// central.ErrInvalid or strict.ErrInvalid): our own validation.
	ClassInvalid
	// ClassCanceled: the caller's context was cancelled; nothing is known about Redis.
	ClassCanceled
)

// String returns "none", "transport", "refused", "bad-key", "invalid" or "canceled".
func (c ErrorClass) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassTransport:
		return "transport"
	case ClassRefused:
		return "refused"
	case ClassBadKey:
		return "bad-key"
	case ClassInvalid:
		return "invalid"
	case ClassCanceled:
		return "canceled"
	}
	return "unknown"
}

// refusedPrefixes are the error replies with which a live Redis refuses to serve a client. A
// go-redis connection whose AUTH or HELLO fails on dial returns the server's reply the same way.
var refusedPrefixes = []string{
	"OOM", "READONLY", "BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MISCONF",
	"NOAUTH", "WRONGPASS", "NOPERM",
	"ERR max number of clients reached",
	"ERR invalid password",                         // Redis before 6 (requirepass)
	"ERR AUTH",                                     // "ERR AUTH <password> called without any password configured"
	"ERR Client sent AUTH, but no password is set", // Redis before 6
}

// Class classifies err. Call it on errors of the calls of packages central and strict; it
// understands errors wrapped with %w.
func Class(err error) ErrorClass {
	var ce *classed
	switch {
	case err == nil:
		return ClassNone
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return ClassTransport
	case errors.Is(err, context.Canceled):
		return ClassCanceled
	case errors.As(err, &ce) && ce.class != ClassBadKey:
		return ce.class
	case ce != nil:
		// A key the script could not process (the script caught the error): a per-key fault, unless
		// what it caught was a refusal of the write or of the command (a write met OOM, an ACL).
		if msg := err.Error(); strings.Contains(msg, "The user executing the script can't") ||
			strings.Contains(msg, "OOM command not allowed") || strings.Contains(msg, "READONLY ") ||
			strings.Contains(msg, "NOPERM ") || strings.Contains(msg, "MISCONF ") {
			return ClassRefused
		}
		return ClassBadKey
	case errors.Is(err, ErrBadReply):
		return ClassBadKey
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return ClassTransport
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return ClassTransport
	}
	msg := re.Error()
	for _, p := range refusedPrefixes {
		if strings.HasPrefix(msg, p) {
			return ClassRefused
		}
	}
	switch {
	case strings.HasPrefix(msg, "ERR The user executing the script can't"):
		// ACLs: a command or key a script uses is not permitted to the limiter's user (Redis 7).
		return ClassRefused
	case strings.HasPrefix(msg, "ERR Error running script"):
		// Redis before 7 wraps the error a script's call met: "... @user_script:12: -OOM ...".
		for _, p := range refusedPrefixes {
			if strings.Contains(msg, ": -"+p) {
				return ClassRefused
			}
		}
	}
	return ClassBadKey
}

// IsTransport reports whether err means Redis could not serve the call, so that the failure policy
// should decide: [Class] is ClassTransport (unreachable, timed out, breaker open, or an error it does
// not recognise) or ClassRefused (an error reply with which Redis refuses writes or this client:
// OOM, READONLY, BUSY, NOAUTH, WRONGPASS, NOPERM, ...). It is false for a nil error, a per-key fault
// (ClassBadKey), a request refused before sending (ClassInvalid) and a cancelled caller. The breaker
// counts exactly these errors as failures.
func IsTransport(err error) bool {
	c := Class(err)
	return c == ClassTransport || c == ClassRefused
}
