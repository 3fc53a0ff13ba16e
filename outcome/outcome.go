// Package outcome is the vocabulary of a decision's outcome shared by every limiter of the module:
// who made a decision ([Source]) and what a limit does when Redis cannot make it ([FailurePolicy]).
// Each is one type with one set of values, owned here and used directly by hybrid, concurrency,
// strict (through policy's rules) and policy: hybrid.Decision.Source, concurrency's Lease.Source and
// policy.Decision.Source are an outcome.Source; hybrid.WithFailurePolicy,
// concurrency.WithFailurePolicy, hybrid.Limit.OnFailure and policy.Rule.OnFailure take an
// outcome.FailurePolicy. What a policy does in detail is the business of the limiter it is given to,
// and its With option says so.
//
// The package has no state and does no I/O; its values are plain constants, safe for concurrent use.
package outcome

import "fmt"

// FailurePolicy says what a limit does when Redis cannot answer a decision that needs it: the
// circuit breaker is open, or the call failed, timed out or was refused. The zero value,
// DefaultFailure, means "the default of whoever applies it".
type FailurePolicy int

// The failure policies. The values are the same in every package.
const (
	// DefaultFailure, the zero value, is not a policy of its own: it stands for the default of the
	// limiter or rule it is given to, which is LocalFallback unless configured otherwise.
	DefaultFailure FailurePolicy = iota
	// LocalFallback decides on this node alone, within its share of the limit, until Redis is back.
	LocalFallback
	// FailOpen admits every request.
	FailOpen
	// FailClosed denies every request that needs Redis; such a denial is marked Unavailable.
	FailClosed
)

// String returns "default", "local-fallback", "fail-open" or "fail-closed", and
// "FailurePolicy(n)" for any other value.
func (p FailurePolicy) String() string {
	switch p {
	case DefaultFailure:
		return "default"
	case LocalFallback:
		return "local-fallback"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// Valid reports whether p is one of DefaultFailure, LocalFallback, FailOpen and FailClosed.
func (p FailurePolicy) Valid() bool { return p >= DefaultFailure && p <= FailClosed }

// Source says who made a decision. The zero Source is the Source of a zero decision, which no
// limiter returns.
type Source uint8

// The decision sources. A limiter uses those that apply to it: hybrid's decisions come from the
// first four, concurrency's from SourceCentral and SourceFallback, a policy's from all six.
const (
	// SourceLocal: this node's local allowance, no I/O.
	SourceLocal Source = iota + 1
	// SourceCentral: Redis decided, in a synchronous call.
	SourceCentral
	// SourceDenyCache: the key is banned, or Redis denied it recently and its retry-after has not
	// passed.
	SourceDenyCache
	// SourceFallback: Redis could not decide; the failure policy did.
	SourceFallback
	// SourceStrict: a strict rule of a policy, in one atomic Redis call with the request's other
	// strict rules.
	SourceStrict
	// SourceMemo: a policy enforcer remembered the rule's denial of the subject until its
	// retry-after; nothing was asked and nothing consumed.
	SourceMemo
)

// String returns "local", "central", "deny-cache", "fallback", "strict" or "memo"; for the zero
// Source and any other value, "none".
func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceCentral:
		return "central"
	case SourceDenyCache:
		return "deny-cache"
	case SourceFallback:
		return "fallback"
	case SourceStrict:
		return "strict"
	case SourceMemo:
		return "memo"
	}
	return "none"
}
