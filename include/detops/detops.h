// Umbrella header: everything detops offers.
#pragma once

#include "detops/context.h"
#include "detops/deform_conv2d.h"
#include "detops/dtype.h"
#include "detops/error.h"
#include "detops/frozen_batch_norm.h"
#include "detops/grid_sample.h"
#include "detops/ms_deform_attn.h"
#include "detops/roi_align.h"
#include "detops/roi_align_rotated.h"
#include "detops/communicator.h"
#include "detops/sync_batch_norm.h"
#include "detops/tensor.h"
#include "detops/version.h"
