package redisx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
)

// replyErr stands for an error reply: it implements redis.Error (go-redis's own type is internal).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// Sentinels as the packages that use this one declare them.
var (
	errInvalid   = NewError(ClassInvalid, "test: invalid request")
	errBadPrefix = NewError(ClassInvalid, "test: bad prefix")
	errBadKey    = NewError(ClassBadKey, "test: redis refused this key")
)

func TestClass(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("central: take %q: %w", "k", err) }
	for _, tc := range []struct {
		err  error
		want ErrorClass
	}{
		{nil, ClassNone},
		{ErrUnavailable, ClassTransport},
		{wrap(context.DeadlineExceeded), ClassTransport},
		{wrap(&net.OpError{Op: "dial", Err: errors.New("connection refused")}), ClassTransport},
		{io.EOF, ClassTransport},
		{errors.New("redis: client is closed"), ClassTransport},
		{wrap(replyErr("OOM command not allowed when used memory > 'maxmemory'.")), ClassRefused},
		{wrap(replyErr("READONLY You can't write against a read only replica.")), ClassRefused},
		{replyErr("BUSY Redis is busy running a script."), ClassRefused},
		{replyErr("LOADING Redis is loading the dataset in memory"), ClassRefused},
		{replyErr("MASTERDOWN Link with MASTER is down"), ClassRefused},
		{replyErr("CLUSTERDOWN The cluster is down"), ClassRefused},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), ClassRefused},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"), ClassRefused},
		{replyErr("NOAUTH Authentication required."), ClassRefused},
		{replyErr("WRONGPASS invalid username-password pair or user is disabled."), ClassRefused},
		{replyErr("NOPERM this user has no permissions to run the 'evalsha' command"), ClassRefused},
		{replyErr("ERR max number of clients reached"), ClassRefused},
		{replyErr("ERR The user executing the script can't run this command or subcommand script: 4437, on @user_script:1."), ClassRefused},
		{replyErr("ERR The user executing the script can't access at least one of the keys mentioned in the command script: 4437"), ClassRefused},
		{replyErr("ERR Error running script (call to f_4437): @user_script:1: -OOM command not allowed when used memory > 'maxmemory'."), ClassRefused},
		{replyErr("ERR Error running script (call to f_4437): @user_script:1: user_script:1: attempt to compare nil with number"), ClassBadKey},
		{wrap(replyErr("WRONGTYPE Operation against a key holding the wrong kind of value")), ClassBadKey},
		{replyErr("ERR user_script:1: bad rate"), ClassBadKey},
		{fmt.Errorf("%w: element 0", ErrBadReply), ClassBadKey},
		{wrap(fmt.Errorf("%w: WRONGTYPE Operation against a key holding the wrong kind of value", errBadKey)), ClassBadKey},
		{wrap(fmt.Errorf("%w: OOM command not allowed when used memory > 'maxmemory'.", errBadKey)), ClassRefused},
		{wrap(fmt.Errorf("%w: The user executing the script can't run this command or subcommand", errBadKey)), ClassRefused},
		{fmt.Errorf("%w: n=0", errInvalid), ClassInvalid},
		{errBadPrefix, ClassInvalid},
		{wrap(context.Canceled), ClassCanceled},
	} {
		assert.Equal(t, tc.want, Class(tc.err), "%v", tc.err)
		assert.Equal(t, tc.want == ClassTransport || tc.want == ClassRefused, IsTransport(tc.err), "IsTransport(%v)", tc.err)
	}
}
