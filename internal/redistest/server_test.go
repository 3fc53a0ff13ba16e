package redistest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartAnswersPingWithoutPersistence(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()

	if got, want := s.Addr, "127.0.0.1:"+strconv.Itoa(s.Port); got != want {
		t.Errorf("Addr = %q, want %q", got, want)
	}
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("client PING: %v", err)
	}
	if got, want := s.Do(t, "PING"), any("PONG"); got != want {
		t.Errorf("Do(PING) = %#v, want %#v", got, want)
	}
	for _, tc := range []struct{ param, want string }{{"save", ""}, {"appendonly", "no"}} {
		got := s.Do(t, "CONFIG", "GET", tc.param)
		if want := []any{tc.param, tc.want}; !reflect.DeepEqual(got, want) {
			t.Errorf("CONFIG GET %s = %#v, want %#v", tc.param, got, want)
		}
	}
}

func TestStartedServersAreIndependent(t *testing.T) {
	t.Parallel()
	a, b := Start(t), Start(t)
	if a.Port == b.Port {
		t.Fatalf("both servers got port %d", a.Port)
	}
	a.Do(t, "SET", "k", "a")
	if got := b.Do(t, "GET", "k"); got != nil {
		t.Errorf("GET k on the other server = %#v, want nil", got)
	}
}

func TestStartWithPasswordPresetsIt(t *testing.T) {
	t.Parallel()
	s := Start(t, "--requirepass", "s3cret")
	ctx := context.Background()

	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Errorf("client PING: %v", err)
	}
	if got, want := s.Do(t, "PING"), any("PONG"); got != want {
		t.Errorf("Do(PING) = %#v, want %#v", got, want)
	}
	err := s.Client(t, func(o *redis.Options) { o.Password = "" }).Ping(ctx).Err()
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("PING without password: err = %v, want NOAUTH", err)
	}
}

func TestKillAndRestartOnTheSamePortLoseData(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	rdb := s.Client(t, NoRetries)
	port := s.Port

	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sha, err := rdb.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		t.Fatal(err)
	}

	s.Kill(t)
	if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		c.Close()
		t.Errorf("dial %s after Kill succeeded, want the port closed", s.Addr)
	}
	s.Kill(t) // killing a dead server is a no-op

	checkEmptyAfterRestart := func(t *testing.T) {
		t.Helper()
		if got, want := s.Port, port; got != want {
			t.Errorf("Port after Restart = %d, want %d", got, want)
		}
		eventually(t, 5*time.Second, func() error { return rdb.Ping(ctx).Err() })
		if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("GET k after Restart: err = %v, want redis.Nil", err)
		}
		exists, err := rdb.ScriptExists(ctx, sha).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(exists, []bool{false}) {
			t.Errorf("SCRIPT EXISTS after Restart = %v, want [false]", exists)
		}
	}

	t.Run("a killed server restarts empty", func(t *testing.T) {
		s.Restart(t)
		checkEmptyAfterRestart(t)
	})
	t.Run("a running server restarts empty", func(t *testing.T) {
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ScriptLoad(ctx, "return 1").Err(); err != nil {
			t.Fatal(err)
		}
		s.Restart(t)
		checkEmptyAfterRestart(t)
	})
}

func TestPauseTimesOutAndResumeRecovers(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	rdb := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause(t)
	var netErr net.Error
	if err := rdb.Ping(ctx).Err(); !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Errorf("PING while paused: err = %v, want a timeout", err)
	}

	s.Resume(t)
	eventually(t, 5*time.Second, func() error { return rdb.Ping(ctx).Err() })
}

func TestCleanupKillsAPausedServer(t *testing.T) {
	t.Parallel()
	var s *Server
	t.Run("the server is still paused when the test ends", func(t *testing.T) {
		s = Start(t)
		s.Pause(t)
	})
	if s == nil {
		t.Fatal("subtest did not start a server")
	}
	if s.live() {
		t.Error("server still live after cleanup")
	}
	if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		c.Close()
		t.Errorf("dial %s after cleanup succeeded, want the port closed", s.Addr)
	}
}

func TestCommandStatsCountsScripts(t *testing.T) {
	t.Parallel()
	s := Start(t)
	ctx := context.Background()
	rdb := s.Client(t)

	s.ResetStats(t)
	if err := rdb.Eval(ctx, "return 1", nil).Err(); err != nil {
		t.Fatal(err)
	}
	sha, err := rdb.ScriptLoad(ctx, "return 2").Result()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := rdb.EvalSha(ctx, sha, nil).Err(); err != nil {
			t.Fatal(err)
		}
	}

	stats := s.CommandStats(t)
	for cmd, want := range map[string]int64{"eval": 1, "evalsha": 2, "script|load": 1} {
		if got := stats[cmd]; got != want {
			t.Errorf("CommandStats()[%q] = %d, want %d (all: %v)", cmd, got, want, stats)
		}
	}

	s.ResetStats(t)
	stats = s.CommandStats(t)
	if n := stats["eval"] + stats["evalsha"]; n != 0 {
		t.Errorf("after ResetStats, eval+evalsha = %d, want 0 (all: %v)", n, stats)
	}
}

func TestDoDecodesReplies(t *testing.T) {
	t.Parallel()
	s := Start(t)
	for i, step := range []struct {
		args []any
		want any
	}{
		{[]any{"SET", "k", 42}, "OK"},
		{[]any{"GET", "k"}, "42"},
		{[]any{"INCR", "k"}, int64(43)},
		{[]any{"GET", "missing"}, nil},
		{[]any{"MGET", "k", "missing"}, []any{"43", nil}},
	} {
		if got := s.Do(t, step.args...); !reflect.DeepEqual(got, step.want) {
			t.Errorf("step %d: Do(%v) = %#v, want %#v", i, step.args, got, step.want)
		}
	}
	_, err := s.command(context.Background(), "NOSUCHCOMMAND")
	var re replyError
	if !errors.As(err, &re) || !strings.HasPrefix(string(re), "ERR unknown command") {
		t.Errorf("unknown command: err = %v, want an ERR reply", err)
	}
}

func TestParseCommandStats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		info    string
		want    map[string]int64
		wantErr bool
	}{
		{
			name: "commands and subcommands are keyed in lower case without the prefix",
			info: "# Commandstats\r\n" +
				"cmdstat_evalsha:calls=3,usec=42,usec_per_call=14.00,rejected_calls=0,failed_calls=1\r\n" +
				"cmdstat_script|load:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
				"cmdstat_CLIENT|SETINFO:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n",
			want: map[string]int64{"evalsha": 3, "script|load": 1, "client|setinfo": 2},
		},
		{
			name: "an empty section gives an empty map",
			info: "# Commandstats\r\n",
			want: map[string]int64{},
		},
		{
			name:    "a line without calls is an error",
			info:    "cmdstat_get:usec=1\r\n",
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCommandStats(tc.info)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadReply(t *testing.T) {
	t.Parallel()
	for i, tc := range []struct {
		in   string
		want any
	}{
		{"+OK\r\n", "OK"},
		{"-ERR bad\r\n", replyError("ERR bad")},
		{":-7\r\n", int64(-7)},
		{"$5\r\na\r\nbc\r\n", "a\r\nbc"},
		{"$0\r\n\r\n", ""},
		{"$-1\r\n", nil},
		{"*-1\r\n", nil},
		{"*3\r\n:1\r\n$1\r\nx\r\n*1\r\n-E\r\n", []any{int64(1), "x", []any{replyError("E")}}},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("step %d: readReply(%q) = %#v, %v; want %#v", i, tc.in, got, err, tc.want)
		}
	}
	if _, err := readReply(bufio.NewReader(strings.NewReader("?\r\n"))); err == nil {
		t.Error("unknown reply type: no error")
	}
	if _, err := readReply(bufio.NewReader(strings.NewReader("$3\r\nab"))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short bulk string: err = %v, want io.ErrUnexpectedEOF", err)
	}
}
