// 03_sync_batch_norm_mpi: SyncBatchNorm in exact mode over MPI (detops::mpi). Every rank holds a
// slice of one global batch; the statistics are those of the whole batch, and in exact mode they
// are the same bits for any number of ranks and any split: each rank replays the whole batch on
// its own (communicator nullptr) and must find the statistics and its slice of y and grad_x bit
// for bit. Run it with any number of processes:  mpirun -np 2 ./detops_example_03_sync_batch_norm_mpi
// Exit status 0 when every rank agrees, 1 otherwise.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <detops/detops.h>
#include <detops/mpi.h>

namespace {

using namespace detops;
constexpr std::int64_t N = 5, C = 3, H = 4, W = 6, kImage = C * H * W;

/// What one rank computes for `count` images: y, grad_x and the statistics the backward needs.
struct Result {
  explicit Result(std::int64_t count)
      : y(Tensor::empty({count, C, H, W}, DType::kFloat32)), grad_x(Tensor::empty({count, C, H, W}, DType::kFloat32)) {}
  Tensor y, grad_x, save_mean = Tensor::zeros({C}, DType::kFloat64), save_invstd = Tensor::zeros({C}, DType::kFloat64);
};

bool same_bytes(const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ok = 1;
  {
    // The global batch, identical on every rank here; a real job loads only its own images.
    std::vector<float> batch(N * kImage), grad(N * kImage), weight = {1.0f, 2.0f, 0.5f}, bias = {0.0f, -1.0f, 3.0f};
    for (std::int64_t i = 0; i < N * kImage; ++i) {
      batch[i] = 100.0f * float((i / (H * W)) % C) + std::sin(0.37f * float(i));  // channel means 0, 100, 200
      grad[i] = std::cos(0.11f * float(i));
    }
    SyncBnParams params;
    params.weight = TensorView(weight.data(), DType::kFloat32, Device::cpu(), {C});
    params.bias = TensorView(bias.data(), DType::kFloat32, Device::cpu(), {C});
    // [readme:sync_bn_mpi]
    // Given the global batch and its gradient (std::vector<float>, N images of [C, H, W] each) and
    // params (weight and bias; running statistics optional):
    SyncBnOptions opts;
    opts.mode = SyncBnMode::kExact;  // same bits for any number of ranks and any split
    // Forward and backward of images [first, first + count) over comm (nullptr: this process alone).
    auto train = [&](std::int64_t first, std::int64_t count, Communicator* comm) {
      TensorView x(batch.data() + first * kImage, DType::kFloat32, Device::cpu(), {count, C, H, W});
      TensorView grad_y(grad.data() + first * kImage, DType::kFloat32, Device::cpu(), {count, C, H, W});
      Result r(count);
      sync_batch_norm_forward(x, params, r.y, r.save_mean, r.save_invstd, comm, opts);
      sync_batch_norm_backward(grad_y, x, params.weight, r.save_mean, r.save_invstd, r.grad_x,
                               /*grad_weight=*/{}, /*grad_bias=*/{}, comm, opts);
      return r;
    };
    MpiCommunicator comm(MPI_COMM_WORLD);  // after MPI_Init; destroy it before MPI_Finalize
    const std::int64_t begin = N * comm.rank() / comm.size(), end = N * (comm.rank() + 1) / comm.size();
    Result mine = train(begin, end - begin, &comm);  // this rank's images, statistics of all ranks
    // [/readme:sync_bn_mpi]
    Result alone = train(0, N, nullptr);  // the whole batch in one process
    const std::size_t slice = std::size_t((end - begin) * kImage) * sizeof(float);
    ok = same_bytes(mine.save_mean.data<double>(), alone.save_mean.data<double>(), C * sizeof(double)) &&
         same_bytes(mine.save_invstd.data<double>(), alone.save_invstd.data<double>(), C * sizeof(double)) &&
         same_bytes(mine.y.data<float>(), alone.y.data<float>() + begin * kImage, slice) &&
         same_bytes(mine.grad_x.data<float>(), alone.grad_x.data<float>() + begin * kImage, slice);
    std::printf("03_sync_batch_norm_mpi: rank %d of %d, images [%lld, %lld), mean[1] = %.17g: %s\n", comm.rank(),
                comm.size(), (long long)begin, (long long)end, mine.save_mean.data<double>()[1],
                ok ? "the one-process bits" : "DIFFERENT from one process");
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
