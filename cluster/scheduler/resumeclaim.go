package scheduler

import (
	"context"
	"fmt"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A resume claim is a Redis key holding its holder's token with an expiry:
// SET NX grants it to one gateway replica at a time, and only the holder
// deletes it (a claim that outlived its TTL may be another's by then).

// maxResumeClaim bounds a claim's TTL: a resume fetches a sandbox's state
// from the repository, which takes seconds, not hours.
const maxResumeClaim = 10 * time.Minute

func (k keys) resumeClaim(id string) string { return k.p + "resume:" + id }

var releaseClaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// ClaimResume implements pb.SchedulerServer.
func (s *Scheduler) ClaimResume(ctx context.Context, req *pb.ClaimResumeRequest) (*pb.ClaimResumeResponse, error) {
	if err := checkClaim(req.GetSandboxId(), req.GetHolder()); err != nil {
		return nil, err
	}
	ttl := time.Duration(req.GetTtlMs()) * time.Millisecond
	if ttl <= 0 || ttl > maxResumeClaim {
		return nil, status.Errorf(codes.InvalidArgument, "claim resume of %s: ttl must be within 1 ms..%s", req.GetSandboxId(), maxResumeClaim)
	}
	ok, err := s.rdb.SetNX(ctx, s.k.resumeClaim(req.GetSandboxId()), req.GetHolder(), ttl).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("claim resume of %s: %w", req.GetSandboxId(), err))
	}
	return &pb.ClaimResumeResponse{Granted: ok}, nil
}

// ReleaseResume implements pb.SchedulerServer.
func (s *Scheduler) ReleaseResume(ctx context.Context, req *pb.ReleaseResumeRequest) (*pb.ReleaseResumeResponse, error) {
	if err := checkClaim(req.GetSandboxId(), req.GetHolder()); err != nil {
		return nil, err
	}
	if err := releaseClaimScript.Run(ctx, s.rdb, []string{s.k.resumeClaim(req.GetSandboxId())}, req.GetHolder()).Err(); err != nil {
		return nil, internal(fmt.Errorf("release resume claim of %s: %w", req.GetSandboxId(), err))
	}
	return &pb.ReleaseResumeResponse{}, nil
}

func checkClaim(id, holder string) error {
	if err := checkName("sandbox id", id); err != nil {
		return err
	}
	if holder == "" || len(holder) > maxName {
		return status.Errorf(codes.InvalidArgument, "resume claim of %s: a holder of 1 to %d bytes is required", id, maxName)
	}
	return nil
}
