package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// defaultCmdTimeout bounds a harness command when the context has no deadline.
const defaultCmdTimeout = 5 * time.Second

// replyError is an error reply ("-ERR ...") from Redis.
type replyError string

func (e replyError) Error() string { return string(e) }

// do runs cmd(args) within defaultCmdTimeout and returns its reply; an error fails tb, naming
// where (the server's address).
func do(tb testing.TB, where string, cmd func(ctx context.Context, args ...any) (any, error), args []any) any {
	tb.Helper()
	v, err := cmd(context.Background(), args...)
	if err != nil {
		tb.Fatalf("redistest: %v on %s: %v", args, where, err)
	}
	return v
}

// command sends one command on a new connection to addr (over TLS with
// tlsConfig when it is not nil) and returns the
// decoded RESP2 reply: string for simple and bulk strings, int64 for integers,
// []any for arrays and nil for null replies. An error reply is returned as an
// error of type replyError; errors nested inside arrays stay in the array.
//
// It is deliberately not go-redis: it sends no HELLO or CLIENT SETINFO, so
// the harness adds nothing to CommandStats but its own command (and AUTH when
// password is set), and it starts no goroutines.
func command(ctx context.Context, addr, password string, tlsConfig *tls.Config, args ...any) (any, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultCmdTimeout)
	}
	var conn net.Conn
	var err error
	if tlsConfig != nil {
		d := tls.Dialer{NetDialer: &net.Dialer{Deadline: deadline}, Config: tlsConfig}
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		d := net.Dialer{Deadline: deadline}
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	// Close the connection when ctx ends, so a cancelled context interrupts
	// a read from a hung server.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	rd := bufio.NewReader(conn)
	if password != "" {
		if _, err := roundTrip(conn, rd, "AUTH", password); err != nil {
			return nil, fmt.Errorf("AUTH: %w", err)
		}
	}
	return roundTrip(conn, rd, args...)
}

func roundTrip(w io.Writer, rd *bufio.Reader, args ...any) (any, error) {
	if _, err := w.Write(appendCommand(nil, args)); err != nil {
		return nil, err
	}
	v, err := readReply(rd)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(replyError); ok {
		return nil, e
	}
	return v, nil
}

// appendCommand encodes args as a RESP array of bulk strings.
func appendCommand(b []byte, args []any) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		var s string
		switch v := a.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		default:
			s = fmt.Sprint(v)
		}
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, '\r', '\n')
		b = append(b, s...)
		b = append(b, '\r', '\n')
	}
	return b
}

// readReply decodes one RESP2 reply.
func readReply(rd *bufio.Reader) (any, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redistest: malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return replyError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = readReply(rd); err != nil {
				return nil, err
			}
		}
		return arr, nil
	default:
		return nil, errors.New("redistest: unexpected reply type " + strconv.Quote(line))
	}
}
